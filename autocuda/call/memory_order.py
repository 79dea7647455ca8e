"""Inputs that are dense in another memory order than the contiguous one (`torch.channels_last`, a permuted view):
the kernels run on the permuted view that is contiguous, with no copy, and every output keeps the input's layout,
as torch's elementwise ops do.

A neuron acts on each neuron alone, so the order in which the neurons lie in memory changes nothing but where
each neuron's own values are: its states and its tensor parameters are permuted the same way (a parameter after
broadcasting to the neuron's dims, so one value per channel stays one per channel).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["MemoryOrder", "broadcasts", "memory_order"]

Tensor = torch.Tensor


class MemoryOrder:
    """The permutation `order` of an input's dims under which it is contiguous; its first `first` dims (T of a
    sequence) stay in place."""

    def __init__(self, order: tuple[int, ...], first: int):
        self.order = order
        self.neuron_order = tuple(d - first for d in order[first:])
        self.inverse, self.neuron_inverse = _inverse(order), _inverse(self.neuron_order)

    def inputs(self, inputs: Sequence[Tensor]) -> tuple[Tensor, ...]:
        return tuple(u.permute(self.order) for u in inputs)

    def states(self, states: Sequence[Tensor | float]) -> tuple[Tensor | float, ...]:
        return tuple(s.permute(self.neuron_order) if isinstance(s, Tensor) else s for s in states)

    def params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Tensor parameters broadcast to the neuron's dims (by views: their gradients flow back) and permuted."""
        dims = len(self.neuron_order)
        return {name: value.reshape((1,) * (dims - value.dim()) + tuple(value.shape)).permute(self.neuron_order)
                if isinstance(value, Tensor) else value for name, value in params.items()}

    def sequence(self, t: Tensor) -> Tensor:
        """An output of the input's dims (a spike or state sequence) back in the input's dim order."""
        return t.permute(self.inverse)

    def neuron(self, t: Tensor) -> Tensor:
        """An output of the neuron's dims (a state) back in the input's dim order."""
        return t.permute(self.neuron_inverse)


def memory_order(x: Tensor, first: int, states: Sequence[Any], params: Mapping[str, Any]) -> MemoryOrder | None:
    """How to run a call on x without copying it: None where x is contiguous already, or dense in no order that
    keeps its first `first` dims outermost, or where a state or parameter would not match the neuron's dims (the
    call then checks them as given, and its errors name the shapes the caller passed)."""
    if x.is_contiguous():
        return None
    order = (*range(first), *_by_stride(x, first))
    if order == tuple(range(x.dim())) or not x.permute(order).is_contiguous():
        return None
    neuron_shape = tuple(x.shape[first:])
    if any(isinstance(s, Tensor) and tuple(s.shape) != neuron_shape for s in states):
        return None
    if any(isinstance(v, Tensor) and not broadcasts(tuple(v.shape), neuron_shape) for v in params.values()):
        return None
    return MemoryOrder(order, first)


def broadcasts(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """`shape` expands to `target` (numpy rules, without growing `target`). Compared with `==`, not `in`: Dynamo
    answers `in` on a tuple holding a symbolic size (a dynamic shape) by identity, so a size equal to it fails."""
    return len(shape) <= len(target) and all(a == 1 or a == b for a, b in zip(reversed(shape), reversed(target)))


def _by_stride(x: Tensor, first: int) -> list[int]:
    """x's dims from `first` on by decreasing stride, the lower dim first among equal strides. Picked by pairwise
    comparisons, not `sorted`: under torch.compile with dynamic shapes the strides are symbolic, which Dynamo
    compares (guarding on the answer) but does not sort."""
    left, order = list(range(first, x.dim())), []
    while left:
        widest = left[0]
        for d in left[1:]:
            if x.stride(d) > x.stride(widest):
                widest = d
        order.append(widest)
        left.remove(widest)
    return order


def _inverse(order: tuple[int, ...]) -> tuple[int, ...]:
    inverse = [0] * len(order)
    for position, dim in enumerate(order):
        inverse[dim] = position
    return tuple(inverse)
