"""The limits of an untrusted NIR graph, and the checks of its fields' values.

A NIR file is untrusted input: a few kilobytes can declare a parameter of 10**9 values (a compressed HDF5
dataset of zeros), a chain of thousands of nodes, subgraphs nested a thousand deep, NaN time constants, or a
delay of days at a step of microseconds. The limits below hold for graphs read from a file (checked before a
dataset is read) and for `nir.NIRGraph` objects (checked before anything is built); each refusal is a
`NIRError` naming the node and field. They are module attributes: a program that trusts bigger graphs may raise
them (`autocuda.nir.checks.MAX_NODES = ...`).
"""
from __future__ import annotations

import math
import numbers

import numpy as np
import torch

from ...base.errors import NIRError

__all__ = ["MAX_NODES", "MAX_EDGES", "MAX_DEPTH", "MAX_FIELD_ELEMENTS", "MAX_GRAPH_ELEMENTS", "MAX_DELAY_VALUES",
           "Budget", "real", "floats", "integers", "time_step"]

MAX_NODES = 10_000  # nodes of a graph, those of its subgraphs (and the subgraphs) counted
MAX_EDGES = 100_000  # edges of a graph and its subgraphs together
MAX_DEPTH = 16  # subgraphs within subgraphs
MAX_FIELD_ELEMENTS = 2**25  # values of one field (33.5 million: 256 MiB in float64)
MAX_GRAPH_ELEMENTS = 2**26  # values of all fields of a graph together (512 MiB in float64)
MAX_DELAY_VALUES = 2**22  # a Delay's buffer per sample: (its longest delay in steps + 1) x its neurons
_INT_RANGE = 2**31  # integer fields (kernel sizes, strides, dimensions) lie within +-2**31


class Budget:
    """Counts the nodes, edges and field values of one graph against the limits."""

    def __init__(self) -> None:
        self.nodes = self.edges = self.elements = 0

    def node(self, name: str) -> None:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise NIRError(f"graph: more than {MAX_NODES} nodes (at node {name!r}): the limit is "
                           "autocuda.tools.nir.checks.MAX_NODES")

    def edge_count(self, graph: str, count: int) -> None:
        self.edges += count
        if self.edges > MAX_EDGES:
            raise NIRError(f"graph {graph!r}: more than {MAX_EDGES} edges: the limit is "
                           "autocuda.tools.nir.checks.MAX_EDGES")

    def field(self, where: str, size: int) -> None:
        """Counts a field of `size` values (before it is read or converted)."""
        _check_size(size, where)
        self.elements += size
        if self.elements > MAX_GRAPH_ELEMENTS:
            raise NIRError(f"{where}: the graph's fields hold more than {MAX_GRAPH_ELEMENTS} values together "
                           "(autocuda.tools.nir.checks.MAX_GRAPH_ELEMENTS)")


def real(value: object, where: str) -> np.ndarray:
    """`value` as an array of real numbers (no copy where it is one), its size checked before any conversion."""
    if isinstance(value, torch.Tensor):  # as some exporters (Norse's) leave them
        _check_size(value.numel(), where)
        value = value.detach().cpu()
        value = (value.double() if value.is_floating_point() or value.is_complex() else value).numpy()
    if isinstance(value, np.ndarray):
        array = value
    else:
        try:
            array = np.asarray(value)
        except (ValueError, TypeError) as error:  # ragged lists and the like
            raise NIRError(f"{where}: expected an array of numbers, got {type(value).__name__} ({error})") from None
    _check_size(array.size, where)
    if array.dtype.kind not in "biuf":
        raise NIRError(f"{where}: expected real numbers, got an array of {array.dtype}")
    return array


def _check_size(size: int, where: str) -> None:
    if size > MAX_FIELD_ELEMENTS:
        raise NIRError(f"{where}: {size} values, more than the {MAX_FIELD_ELEMENTS} a field may hold "
                       "(autocuda.tools.nir.checks.MAX_FIELD_ELEMENTS)")


def floats(value: object, where: str, dtype: torch.dtype, positive: bool = False) -> np.ndarray:
    """`value` as a new float64 array whose every value is finite (and > 0 where `positive`) once cast to `dtype`:
    NaN, infinities, values beyond the dtype's range and time constants that round to 0 are refused."""
    array = real(value, where).astype(np.float64)  # a copy: the caller's arrays are never shared
    cast = torch.from_numpy(array).to(dtype)
    bad = ~torch.isfinite(cast)
    if positive:
        bad |= cast <= 0
    if bool(bad.any()):
        index = np.unravel_index(int(bad.flatten().nonzero()[0, 0]), array.shape) if array.ndim else ()
        found = float(array[index])
        rule = "positive and finite" if positive else "finite"
        raise NIRError(f"{where}: must be {rule} in {str(dtype).removeprefix('torch.')}, got {found!r}"
                       + (f" at index {tuple(int(i) for i in index)}" if array.ndim else ""))
    return array


def integers(value: object, where: str, minimum: int, counts: tuple[int, ...] = (1,)) -> tuple[int, ...]:
    """`value` as whole numbers >= `minimum` (below 2**31), `counts` of them (a single one stands for all)."""
    array = real(value, where).reshape(-1)
    if array.size not in counts:
        raise NIRError(f"{where}: expected {' or '.join(map(str, counts))} whole numbers, got {array.size}")
    numbers = array.astype(np.float64)
    if not np.all(np.isfinite(numbers)) or np.any(numbers != np.round(numbers)) or \
            np.any(numbers < minimum) or np.any(numbers >= _INT_RANGE):
        raise NIRError(f"{where}: expected whole numbers from {minimum} to {_INT_RANGE - 1}, got {array.tolist()}")
    return tuple(int(n) for n in numbers)


def time_step(dt: object, dtype: torch.dtype = torch.float64) -> float:
    """`dt` as a float: a real number (not a bool, a string or a tensor), finite and positive in `dtype`."""
    if isinstance(dt, (bool, np.bool_)) or not isinstance(dt, numbers.Real):
        raise NIRError(f"dt: the time step must be a number of seconds, got {type(dt).__name__} {dt!r}")
    step = float(dt)
    if not (math.isfinite(step) and step > 0 and torch.tensor(step, dtype=dtype) > 0):
        raise NIRError(f"dt: the time step must be positive and finite (in {dtype}), got {dt!r}")
    return step
