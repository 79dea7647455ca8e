"""SpikingJelly 2.0's few-spike neurons (neuron/few_spike.py; Stöckl and Maass's FS-neurons, for converting an
ANN's activation into K weighted spikes): a table of K steps (θ_k, h_k, d_k) turns a gate value v into the spikes
z_k = Θ(v_k - θ_k), v_{k+1} = v_k - h_k·z_k, and the output Σ_k d_k·z_k (single step) or the sequence d_k·z_k
(multi-step, whose gate is the sum of the K inputs). The spike's gradient is the surrogate's.

- `FewSpikeTable(theta, h, d)`: the table (SpikingJelly's, with its checks);
- `FewSpikeNode(table)`: one table;
- `OutlierAwareThresholdNode(table, outlier_table, split_threshold, clamp_value)`: |gate| above split_threshold
  runs the outlier table, the sign restored after (the gate clamped to ±clamp_value first);
- `HGNode(tables, gate_thresholds)`: the gate's region among the thresholds picks the table.

The three run the few-spike kernels (`call.few_spike`: one thread per neuron, the gate, its table row and the K
steps in registers; backward rebuilds them from x) on a GPU, for K up to 64 and a surrogate of ours or
SpikingJelly's in its spiking form, outside torch.compile; elsewhere a torch composition: a table is a different
parameter at each of the K steps, which the spec language has no form for.
The constructors, buffers (names, shapes, dtypes), checks and results are SpikingJelly's; a table may be ours or
SpikingJelly's `FewSpikeTable`; `surrogate_function` takes ours or SpikingJelly's objects.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

from ..call import few_spike
from ..spec.surrogate import Sigmoid
from .arguments import TakesSurrogate, as_values, checked_attribute, require_number

__all__ = ["FewSpikeTable", "FewSpikeNode", "OutlierAwareThresholdNode", "HGNode"]

Tables = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # theta, h, d [R, K]; R - 1 gate thresholds


def _vector(name: str, value: Any) -> torch.Tensor:
    """A table's column: a non-empty, finite, real 1-D tensor (integers as the default float dtype), copied."""
    tensor = as_values(name, value)  # a word, None or a bool refused by name
    if tensor.dim() != 1:
        raise ValueError(f"{name}: must be a 1-D tensor or sequence, got shape {tuple(tensor.shape)}")
    if tensor.numel() == 0:
        raise ValueError(f"{name}: must not be empty")
    if torch.is_complex(tensor):
        raise TypeError(f"{name}: must be real, got {tensor.dtype}")
    if not torch.is_floating_point(tensor):
        tensor = tensor.to(torch.get_default_dtype())
    if not torch.isfinite(tensor).all():
        raise ValueError(f"{name}: must hold finite values only")
    return tensor.detach().clone()


class FewSpikeTable:
    """`FewSpikeTable(theta, h, d)`: K steps' thresholds θ, membrane decrements h and output weights d."""

    def __init__(self, theta: Any, h: Any, d: Any):
        self.theta, self.h, self.d = _vector("theta", theta), _vector("h", h), _vector("d", d)
        if not self.theta.shape == self.h.shape == self.d.shape:
            raise ValueError(f"theta, h and d: must have one shape, got {tuple(self.theta.shape)}, "
                             f"{tuple(self.h.shape)} and {tuple(self.d.shape)}")

    @property
    def K(self) -> int:
        return self.theta.numel()

    def __repr__(self) -> str:
        return f"FewSpikeTable(K={self.K})"


def as_table(name: str, table: Any, steps: int | None = None) -> FewSpikeTable:
    """Ours, or any table with `theta`, `h` and `d` (SpikingJelly's FewSpikeTable), checked as ours; of `steps`
    steps where given."""
    if not all(hasattr(table, column) for column in ("theta", "h", "d")):
        raise TypeError(f"{name}: expected a FewSpikeTable, got {type(table).__name__}")
    if not isinstance(table, FewSpikeTable):
        table = FewSpikeTable(table.theta, table.h, table.d)
    if steps is not None and table.K != steps:
        raise ValueError(f"{name}: must have K = {steps} steps (the first table's), got {table.K}")
    return table


def _like(tensor: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    return tensor.to(device=reference.device, dtype=reference.dtype).clone()


class FewSpikeNode(TakesSurrogate):
    """`FewSpikeNode(table, surrogate_function=Sigmoid(), step_mode='s')`: 's' takes the gate x [*] and returns
    Σ_k d_k z_k [*]; 'm' takes x_seq [K, *] (the gate is its sum) and returns d_k z_k [K, *]."""

    theta: torch.Tensor
    h: torch.Tensor
    d: torch.Tensor

    def __init__(self, table: FewSpikeTable, surrogate_function: Any = None, step_mode: str = "s"):
        super().__init__()
        table = as_table("table", table)
        self.register_buffer("theta", table.theta.clone())
        self.register_buffer("h", table.h.clone())
        self.register_buffer("d", table.d.clone())
        self._start(surrogate_function, step_mode)

    def _start(self, surrogate_function: Any, step_mode: str) -> None:
        self.surrogate_function = Sigmoid() if surrogate_function is None else surrogate_function
        self.step_mode = step_mode

    @property
    def step_mode(self) -> str:
        return self.__dict__["_step_mode"]

    @step_mode.setter
    def step_mode(self, value: str) -> None:
        if value not in ("s", "m"):
            raise ValueError(f"step_mode: expected 's' (single step) or 'm' (multi step), got {value!r}")
        self.__dict__["_step_mode"] = value

    @property
    def K(self) -> int:
        return self.theta.numel()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.multi_step_forward(x) if self.step_mode == "m" else self.single_step_forward(x)

    def single_step_forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_input("x", x)
        return self._run(x, sequence=False)

    def multi_step_forward(self, x_seq: torch.Tensor) -> torch.Tensor:
        _check_input("x_seq", x_seq)
        if x_seq.dim() < 1 or x_seq.shape[0] != self.K:
            raise ValueError(f"x_seq: expected shape [K = {self.K}, *], got {tuple(x_seq.shape)}")
        return self._run(x_seq, sequence=True)

    def _run(self, x: torch.Tensor, sequence: bool) -> torch.Tensor:
        """The call by the few-spike kernels where they run it (`call.few_spike.run`), else composed."""
        self._check_tables()
        tables = self._kernel_tables()
        if tables is not None:
            out = few_spike.run(self._kernel_input(x), *tables, self.surrogate_function, sequence,
                                **self._kernel_options())
            if out is not None:
                return out
        return self._from_gate(x.sum(dim=0) if sequence else x, sequence)

    def _check_tables(self) -> None:
        """The table's buffers, which a user may replace, still one table: theta, h and d of one shape [K]."""
        _one_shape(self, ("theta", "h", "d"), 1)

    def _kernel_tables(self) -> Tables | None:
        """(theta, h, d [R, K], the R - 1 gate thresholds) for the kernels: one table, no thresholds."""
        return self.theta.unsqueeze(0), self.h.unsqueeze(0), self.d.unsqueeze(0), self.theta.new_empty(0)

    def _kernel_input(self, x: torch.Tensor) -> torch.Tensor:
        """x in the dtype the composition gives: its own (a table entry is a 0-d tensor, which does not promote)."""
        return x

    def _kernel_options(self) -> dict[str, Any]:
        return {}

    def _from_gate(self, gate: torch.Tensor, sequence: bool) -> torch.Tensor:
        return self._steps(gate, self.theta, self.h, self.d, sequence)

    def _steps(self, gate: torch.Tensor, theta: Iterable[torch.Tensor], h: Iterable[torch.Tensor],
               d: Iterable[torch.Tensor], sequence: bool) -> torch.Tensor:
        """The K steps from the gate, each step's (θ_k, h_k, d_k) a table entry or a tensor of them per element:
        the weighted spikes [K, *] where `sequence`, else their sum."""
        v, outputs = gate, []
        for theta_k, h_k, d_k in zip(theta, h, d):
            z = self.surrogate_function(v - theta_k)
            outputs.append(d_k * z)
            v = v - h_k * z
        if sequence:
            return torch.stack(outputs)
        total = torch.zeros_like(gate)
        for weighted in outputs:  # summed in step order, from zero
            total = total + weighted
        return total

    def extra_repr(self) -> str:
        return f"K={self.K}, step_mode={self.step_mode}"


def _one_shape(layer: nn.Module, names: Sequence[str], dims: int) -> None:
    """The buffers `names` of `layer` are `dims`-D tensors of one shape (every step has its θ, h and d; the kernels
    read each as the first's shape), else a ValueError naming them."""
    shapes = [tuple(getattr(layer, name).shape) if isinstance(getattr(layer, name), torch.Tensor) else None
              for name in names]
    if shapes[0] is None or len(shapes[0]) != dims or shapes[0][-1] == 0 or any(s != shapes[0] for s in shapes):
        raise ValueError(f"{type(layer).__name__}: {', '.join(names)}: must be non-empty {dims}-D tensors of one shape "
                         f"(one entry per step), got shapes {shapes}")


def _checked_split(value: Any) -> float:
    require_number("split_threshold", value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"split_threshold: must be finite and >= 0, got {value!r}")
    return float(value)


def _checked_clamp(value: Any) -> float | None:
    require_number("clamp_value", value, none=True)
    if value is not None and (not math.isfinite(value) or value <= 0):
        raise ValueError(f"clamp_value: must be finite and > 0 (or None), got {value!r}")
    return None if value is None else float(value)


def _check_input(name: str, x: Any) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if not torch.is_floating_point(x):
        raise TypeError(f"{name}: expected a floating-point tensor, got {x.dtype}")


class OutlierAwareThresholdNode(FewSpikeNode):
    """`OutlierAwareThresholdNode(table, outlier_table, split_threshold, clamp_value=None, surrogate_function=
    Sigmoid(), step_mode='s')`: the magnitude of the gate (clamped to ±clamp_value) runs `table` up to
    split_threshold and `outlier_table` above it; the output takes the gate's sign."""

    outlier_theta: torch.Tensor
    outlier_h: torch.Tensor
    outlier_d: torch.Tensor

    def __init__(self, table: FewSpikeTable, outlier_table: FewSpikeTable, split_threshold: float,
                 clamp_value: float | None = None, surrogate_function: Any = None, step_mode: str = "s"):
        table = as_table("table", table)
        outlier_table = as_table("outlier_table", outlier_table, table.K)
        split_threshold, clamp_value = _checked_split(split_threshold), _checked_clamp(clamp_value)
        if clamp_value is not None and clamp_value < split_threshold:
            raise ValueError(f"clamp_value: must be >= split_threshold ({split_threshold}), got {clamp_value}")
        super().__init__(table, surrogate_function, step_mode)
        for column in ("theta", "h", "d"):
            self.register_buffer(f"outlier_{column}", _like(getattr(outlier_table, column), getattr(table, column)))
        self.split_threshold, self.clamp_value = split_threshold, clamp_value

    split_threshold = checked_attribute("split_threshold", _checked_split,
                                        "The gate's magnitude above which the outlier table runs")
    clamp_value = checked_attribute("clamp_value", _checked_clamp,
                                    "The bound of the gate's magnitude (None: none; its order with split_threshold is "
                                    "checked at each call: either may be set first)")

    def _check_tables(self) -> None:
        _one_shape(self, ("theta", "h", "d", "outlier_theta", "outlier_h", "outlier_d"), 1)
        if self.clamp_value is not None and self.clamp_value < self.split_threshold:
            raise ValueError(f"clamp_value: must be >= split_threshold ({self.split_threshold}), got "
                             f"{self.clamp_value}")

    def _kernel_tables(self) -> Tables:
        """The inlier table, then the outlier one (the magnitude's region: above split_threshold)."""
        stacked = [torch.stack((getattr(self, c), getattr(self, f"outlier_{c}"))) for c in ("theta", "h", "d")]
        return stacked[0], stacked[1], stacked[2], self.theta.new_tensor([self.split_threshold])

    def _kernel_input(self, x: torch.Tensor) -> torch.Tensor:
        """x in the dtype the composition gives: promoted with the tables' (each step's entries are picked per
        element)."""
        return x.to(torch.promote_types(x.dtype, self.theta.dtype))

    def _kernel_options(self) -> dict[str, Any]:
        return {"signed": True, "clamp_value": math.inf if self.clamp_value is None else self.clamp_value}

    def _from_gate(self, gate: torch.Tensor, sequence: bool) -> torch.Tensor:
        if self.clamp_value is not None:
            gate = gate.clamp(-self.clamp_value, self.clamp_value)
        sign, magnitude = torch.sign(gate).detach(), gate.abs()
        inlier = magnitude <= self.split_threshold

        def pick(column: str) -> Iterable[torch.Tensor]:
            outlier = getattr(self, f"outlier_{column}")
            return (torch.where(inlier, a, b) for a, b in zip(getattr(self, column), outlier))

        output = self._steps(magnitude, pick("theta"), pick("h"), pick("d"), sequence)
        return output * (sign.unsqueeze(0) if sequence else sign)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, split_threshold={self.split_threshold}, clamp_value={self.clamp_value}"


class HGNode(FewSpikeNode):
    """`HGNode(tables, gate_thresholds, surrogate_function=Sigmoid(), step_mode='s')`: len(tables) - 1 strictly
    increasing thresholds split the gate's range into regions, region i running tables[i] (torch.bucketize's
    regions: a gate equal to a threshold is in the region below it)."""

    region_theta: torch.Tensor
    region_h: torch.Tensor
    region_d: torch.Tensor
    gate_thresholds: torch.Tensor

    def __init__(self, tables: Sequence[FewSpikeTable], gate_thresholds: Any, surrogate_function: Any = None,
                 step_mode: str = "s"):
        if isinstance(tables, (str, bytes)) or not isinstance(tables, Sequence):
            raise TypeError(f"tables: expected a sequence of FewSpikeTables, got {type(tables).__name__}")
        if len(tables) == 0:
            raise ValueError("tables: must hold at least one FewSpikeTable")
        first = as_table("tables[0]", tables[0])
        checked = [first, *(as_table(f"tables[{i}]", t, first.K) for i, t in enumerate(tables[1:], start=1))]
        thresholds = as_values("gate_thresholds", gate_thresholds)
        if thresholds.dim() != 1:
            raise ValueError(f"gate_thresholds: must be 1-D, got shape {tuple(thresholds.shape)}")
        if torch.is_complex(thresholds):
            raise TypeError("gate_thresholds: must be real")
        thresholds = _like(thresholds, first.theta)
        if thresholds.numel() != len(checked) - 1:
            raise ValueError(f"gate_thresholds: must have len(tables) - 1 = {len(checked) - 1} values, got "
                             f"{thresholds.numel()}")
        if not torch.isfinite(thresholds).all():
            raise ValueError("gate_thresholds: must hold finite values only")
        if thresholds.numel() > 1 and not bool((thresholds[1:] > thresholds[:-1]).all()):
            raise ValueError("gate_thresholds: must be strictly increasing")
        nn.Module.__init__(self)  # no single table's buffers: a table per region
        for column in ("theta", "h", "d"):
            reference = getattr(first, column)
            self.register_buffer(f"region_{column}", torch.stack([_like(getattr(t, column), reference)
                                                                  for t in checked]))
        self.register_buffer("gate_thresholds", thresholds)
        self._start(surrogate_function, step_mode)

    @property
    def K(self) -> int:
        return self.region_theta.shape[1]

    def _check_tables(self) -> None:
        """The buffers, which a user may replace: the regions' tables of one shape [R, K], and R - 1 thresholds."""
        _one_shape(self, ("region_theta", "region_h", "region_d"), 2)
        regions, thresholds = self.region_theta.shape[0], self.gate_thresholds
        if not isinstance(thresholds, torch.Tensor) or thresholds.dim() != 1 or thresholds.numel() != regions - 1:
            raise ValueError(f"HGNode: gate_thresholds: must be a 1-D tensor of {regions - 1} values (one fewer than "
                             f"the {regions} regions' tables), got {getattr(thresholds, 'shape', thresholds)!r}")

    def _kernel_tables(self) -> Tables:
        return self.region_theta, self.region_h, self.region_d, self.gate_thresholds

    def _kernel_input(self, x: torch.Tensor) -> torch.Tensor:
        """x in the dtype the composition gives: promoted with the tables' (each step's entries are picked per
        element)."""
        return x.to(torch.promote_types(x.dtype, self.region_theta.dtype))

    def _from_gate(self, gate: torch.Tensor, sequence: bool) -> torch.Tensor:
        region = torch.bucketize(gate.detach(), self.gate_thresholds)

        def pick(column: torch.Tensor) -> Iterable[torch.Tensor]:
            return (column[:, k][region] for k in range(self.K))

        return self._steps(gate, pick(self.region_theta), pick(self.region_h), pick(self.region_d), sequence)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, regions={self.region_theta.shape[0]}, gate_thresholds={self.gate_thresholds}"
