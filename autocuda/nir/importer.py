"""NIR graph -> `NIRModule` of torch modules and our neurons (`from_nir`).

Spiking neurons (LIF, IF, CubaLIF) become `autocuda.nn.Neuron`s of the specs in autocuda.nir.specs (fused
kernels on CUDA); LI, I, CubaLI, Threshold, Delay, Scale, SumPool2d are autocuda.nir.modules; Affine, Linear,
Conv1d, Conv2d, Flatten, AvgPool2d are torch.nn layers. Parameters arrive in float64 and are cast to `dtype`;
a neuron parameter whose values are all equal is passed as a float (a scalar of the kernel), others as a
tensor of the neuron shape.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from ..nn.neuron import Neuron
from . import modules as M
from .graph import NIRModule
from .specs import METHODS, NEURONS, nir_spec

if TYPE_CHECKING:
    import nir

__all__ = ["from_nir", "NODE_TYPES"]


@dataclasses.dataclass(frozen=True)
class _Options:
    dt: float
    method: str
    dtype: torch.dtype
    neuron: Mapping[str, Any]  # keyword arguments of every Neuron


def _tensor(value: Any, options: _Options) -> torch.Tensor:
    return torch.as_tensor(np.asarray(value, dtype=np.float64)).to(options.dtype)


def _param(value: Any, options: _Options) -> float | torch.Tensor:
    array = np.asarray(value, dtype=np.float64)
    return float(array.flat[0]) if array.size and np.all(array == array.flat[0]) else _tensor(array, options)


def _pair(value: Any, name: str) -> tuple[int, int]:
    array = np.atleast_1d(np.asarray(value)).astype(int)
    if array.size not in (1, 2):
        raise ValueError(f"{name}: expected one or two integers, got {value!r}")
    return (int(array[0]), int(array[-1]))


def _positive(node: Any, name: str, fields: tuple[str, ...]) -> None:
    for field in fields:
        if field in dataclasses.asdict(node) and np.any(np.asarray(getattr(node, field)) <= 0):
            raise ValueError(f"node {name!r} ({type(node).__name__}): {field} must be positive")


# -- one function per node type ----------------------------------------------------------------------------------
def _neuron(node: Any, name: str, options: _Options) -> nn.Module:
    kind = type(node).__name__
    _positive(node, name, ("tau", "tau_mem", "tau_syn"))
    params: dict[str, Any] = {field: _param(getattr(node, field), options) for field in NEURONS[kind][0]}
    return Neuron(nir_spec(kind, options.method), **options.neuron, time_step=options.dt, **params)


def _non_spiking(module: type[M.StepModule], fields: tuple[str, ...]) -> Callable[[Any, str, _Options], nn.Module]:
    def build(node: Any, name: str, options: _Options) -> nn.Module:
        _positive(node, name, ("tau", "tau_mem", "tau_syn"))
        params = {field: _tensor(getattr(node, field), options) for field in fields}
        return module(params, method=options.method, dt=options.dt)
    return build


def _affine(node: Any, name: str, options: _Options) -> nn.Module:
    weight = np.asarray(node.weight)
    if weight.ndim != 2:
        raise ValueError(f"node {name!r} ({type(node).__name__}): weight must be 2-D, got shape {weight.shape}")
    bias = getattr(node, "bias", None)
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, dtype=options.dtype)
    layer.weight.data = _tensor(weight, options)
    if layer.bias is not None:
        layer.bias.data = _tensor(bias, options)
    return layer


def _padding(value: Any) -> Any:
    return value if isinstance(value, str) else tuple(int(p) for p in np.atleast_1d(value))


def _conv(node: Any, name: str, options: _Options) -> nn.Module:
    weight = np.asarray(node.weight)
    expected = {"Conv1d": 3, "Conv2d": 4}[type(node).__name__]
    if weight.ndim != expected:
        raise ValueError(f"node {name!r} ({type(node).__name__}): weight must be {expected}-D, "
                         f"got shape {weight.shape}")
    conv: Any = nn.Conv1d if expected == 3 else nn.Conv2d
    groups = int(np.asarray(node.groups))
    layer = conv(weight.shape[1] * groups, weight.shape[0], tuple(weight.shape[2:]), stride=_padding(node.stride),
                 padding=_padding(node.padding), dilation=_padding(node.dilation), groups=groups, bias=True,
                 dtype=options.dtype)
    layer.weight.data = _tensor(weight, options)
    if layer.bias is not None:
        layer.bias.data = _tensor(node.bias, options)
    return layer


def _flatten(node: Any, name: str, options: _Options) -> nn.Module:
    # NIR counts dimensions without the batch; torch's start at the batch
    return nn.Flatten(*(d + 1 if d >= 0 else d for d in (int(node.start_dim), int(node.end_dim))))


def _pool(node: Any, name: str, options: _Options) -> nn.Module:
    kernel, stride, padding = (_pair(getattr(node, f), f"{name}.{f}") for f in ("kernel_size", "stride", "padding"))
    if type(node).__name__ == "AvgPool2d":
        return nn.AvgPool2d(kernel, stride, padding)
    return M.SumPool2d(kernel, stride, padding)


def _delay(node: Any, name: str, options: _Options) -> nn.Module:
    steps = np.asarray(node.delay, dtype=np.float64) / options.dt
    whole = np.round(steps)
    if np.any(whole < 0) or not np.allclose(steps, whole, rtol=0, atol=1e-6):
        raise ValueError(f"node {name!r} (Delay): delay / dt must be whole, non-negative numbers of steps "
                         f"(dt = {options.dt:g}); got {steps.flat[:4]}")
    module = M.Delay({"steps": torch.as_tensor(whole, dtype=torch.long)}, dt=options.dt)
    return module


NODE_TYPES: Mapping[str, Callable[[Any, str, _Options], nn.Module]] = {
    "Input": lambda node, name, options: nn.Identity(),
    "Output": lambda node, name, options: nn.Identity(),
    "LIF": _neuron, "IF": _neuron, "CubaLIF": _neuron,
    "LI": _non_spiking(M.LeakyIntegrator, ("tau", "r", "v_leak")),
    "I": _non_spiking(M.Integrator, ("r",)),
    "CubaLI": _non_spiking(M.CubaLI, ("tau_syn", "tau_mem", "r", "v_leak", "w_in")),
    "Affine": _affine, "Linear": _affine, "Conv1d": _conv, "Conv2d": _conv, "Flatten": _flatten,
    "AvgPool2d": _pool, "SumPool2d": _pool,
    "Scale": lambda node, name, options: M.Scale(_tensor(node.scale, options)),
    "Threshold": lambda node, name, options: M.Threshold(_tensor(node.threshold, options)),
    "Delay": _delay,
}


# -- the graph ---------------------------------------------------------------------------------------------------
def _flatten_graph(graph: nir.NIRGraph, prefix: str = "") -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """Nodes and edges with every subgraph's nodes inlined as '<subgraph>.<node>'; an edge into (out of) a
    subgraph goes to its Input (from its Output) node."""
    import nir

    nodes: dict[str, Any] = {}
    edges: list[tuple[str, str]] = []
    ends: dict[str, tuple[str, str]] = {}  # subgraph -> (its input node, its output node)
    for name, node in graph.nodes.items():
        if isinstance(node, nir.NIRGraph):
            inner, inner_edges = _flatten_graph(node, f"{prefix}{name}.")
            nodes.update(inner)
            edges.extend(inner_edges)
            ends[name] = (_single(node.inputs, name, "Input"), _single(node.outputs, name, "Output"))
        else:
            nodes[prefix + name] = node
    for source, target in graph.edges:
        source = f"{source}.{ends[source][1]}" if source in ends else source
        target = f"{target}.{ends[target][0]}" if target in ends else target
        edges.append((prefix + source, prefix + target))
    return nodes, edges


def _single(found: Mapping[str, Any], graph: str, kind: str) -> str:
    if len(found) != 1:
        raise ValueError(f"subgraph {graph!r}: expected one {kind} node, found {len(found)}")
    return next(iter(found))


def from_nir(graph: nir.NIRGraph | str | Path, *, dt: float = 1e-4, method: str = "euler",
             dtype: torch.dtype = torch.float32, step_mode: str = "m", backend: str | None = None,
             surrogate_function: Any = None, detach_reset: bool = False) -> NIRModule:
    """A torch module that runs the NIR graph `graph` (or the file it was written to) with time step `dt`.

    `method`: "euler" (Norse's step; snnTorch's and SpikingJelly's for LIF and IF), "semi_implicit" (Euler with
    CubaLIF's current first: snnTorch's Synaptic, SpikingJelly's CUBALIFNode) or "exact" (x held over a step).
    `backend`, `surrogate_function`, `detach_reset` go to every spiking neuron (`autocuda.nn.Neuron`).
    Unsupported node types are refused with a ValueError naming the node and its type.
    """
    import nir

    if isinstance(graph, (str, Path)):
        graph = nir.read(graph)
    if not isinstance(graph, nir.NIRGraph):
        raise TypeError(f"graph: expected a nir.NIRGraph or a path to one, got {type(graph).__name__}")
    if not dt > 0:
        raise ValueError(f"dt: the time step must be positive, got {dt!r}")
    if method not in METHODS:
        raise ValueError(f"method: expected one of {', '.join(METHODS)}, got {method!r}")
    neuron = {"backend": backend, "detach_reset": detach_reset}
    if surrogate_function is not None:
        neuron["surrogate_function"] = surrogate_function
    options = _Options(float(dt), method, dtype, neuron)
    nodes, edges = _flatten_graph(graph)
    for name, node in nodes.items():
        if type(node).__name__ not in NODE_TYPES:
            raise ValueError(f"node {name!r} has NIR type {type(node).__name__}, which autocuda.nir does not "
                             f"import (supported: {', '.join(NODE_TYPES)})")
    modules = {name: NODE_TYPES[type(node).__name__](node, name, options) for name, node in nodes.items()}
    return NIRModule(modules, edges, _ends(nodes, "Input", graph), _ends(nodes, "Output", graph), step_mode)


def _ends(nodes: Mapping[str, Any], kind: str, graph: Any) -> list[str]:
    """The top-level Input or Output nodes (inlined subgraphs' own ones are inner pass-throughs)."""
    found = [name for name in graph.nodes if type(nodes.get(name)).__name__ == kind]
    if not found:
        raise ValueError(f"graph: no {kind} node")
    return found
