"""NIR graph -> `NIRModule` of torch modules and our neurons (`from_nir`).

Spiking neurons (LIF, IF, CubaLIF) become `autocuda.nn.Neuron`s of the specs in autocuda.nir.specs (fused
kernels on CUDA); LI, I, CubaLI, Threshold, Delay, Scale, SumPool2d are autocuda.nir.modules; Affine, Linear,
Conv1d, Conv2d, Flatten, AvgPool2d are torch.nn layers. Every field is checked (autocuda.nir.checks: its
size before anything is converted, then finite, time constants positive, integers whole and in range) and
copied into a new tensor of `dtype`; a neuron parameter whose values are all equal is passed as a float (a
scalar of the kernel), others as a tensor of the neuron shape. A node's per-neuron fields must broadcast
together; their shapes go to the NIRModule, which checks them against the node's input at each call. A graph
(or file, read by autocuda.nir.reader) that breaks a rule is refused with a NIRError naming the node and field
before any module is built.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from ...base.errors import AutocudaError, NIRError
from ...nn.neuron import Neuron
from . import checks
from . import modules as M
from .graph import NIRModule
from .reader import read
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


# Fields that are time constants: finite and positive; every other float field finite (autocuda.nir.checks)
TIME_CONSTANTS = ("tau", "tau_mem", "tau_syn")
# Per-neuron fields by node type: each of the node's neuron shape, or of one that broadcasts to it (one value for
# all); they must broadcast together, and each to the node's input without time and batch (NIRModule's check)
PER_NEURON: Mapping[str, tuple[str, ...]] = {
    **{kind: fields for kind, (fields, _, _) in NEURONS.items()}, "LI": ("tau", "r", "v_leak"), "I": ("r",),
    "CubaLI": ("tau_syn", "tau_mem", "r", "v_leak", "w_in"), "Scale": ("scale",), "Threshold": ("threshold",),
    "Delay": ("delay",)}
Shape = tuple[int, ...]


def _where(node: Any, name: str, field: str) -> str:
    return f"node {name!r} ({type(node).__name__}): field {field!r}"


def _floats(node: Any, name: str, field: str, options: _Options) -> np.ndarray:
    """The field's values as a new float64 array, checked (finite; time constants positive) in `options.dtype`."""
    return checks.floats(getattr(node, field, None), _where(node, name, field), options.dtype,
                         positive=field in TIME_CONSTANTS)


def _tensor(node: Any, name: str, field: str, options: _Options) -> torch.Tensor:
    """The field as a new tensor of `options.dtype` (never sharing memory with the graph's arrays)."""
    return torch.tensor(_floats(node, name, field, options), dtype=options.dtype)


def _param(node: Any, name: str, field: str, options: _Options) -> float | torch.Tensor:
    array = _floats(node, name, field, options)
    if array.size and np.all(array == array.flat[0]):
        return float(array.flat[0])
    return torch.tensor(array, dtype=options.dtype)


# -- one function per node type ----------------------------------------------------------------------------------
def _neuron(node: Any, name: str, options: _Options) -> Callable[[], nn.Module]:
    """The Neuron of a spiking node, built later (`_finish`): its fields are checked now, with every other node's,
    so that a bad field anywhere is refused before the first (slower) Neuron is built."""
    kind = type(node).__name__
    params: dict[str, Any] = {field: _param(node, name, field, options) for field in NEURONS[kind][0]}
    return functools.partial(Neuron, nir_spec(kind, options.method), **options.neuron, time_step=options.dt,
                             **params)


def _non_spiking(module: type[M.StepModule], fields: tuple[str, ...]) -> Callable[[Any, str, _Options], nn.Module]:
    def build(node: Any, name: str, options: _Options) -> nn.Module:
        params = {field: _tensor(node, name, field, options) for field in fields}
        return module(params, method=options.method, dt=options.dt)
    return build


def _bias(node: Any, name: str, options: _Options, outputs: int) -> torch.Tensor:
    bias = _floats(node, name, "bias", options)
    if bias.size not in (1, outputs) or bias.ndim > 1:
        raise NIRError(f"{_where(node, name, 'bias')}: expected {outputs} values (one per output), got shape "
                       f"{bias.shape}")
    return torch.tensor(np.broadcast_to(bias.reshape(-1), (outputs,)), dtype=options.dtype)


def _affine(node: Any, name: str, options: _Options) -> nn.Module:
    weight = _floats(node, name, "weight", options)
    if weight.ndim != 2:
        raise NIRError(f"{_where(node, name, 'weight')}: must be 2-D, got shape {weight.shape}")
    has_bias = type(node).__name__ == "Affine"
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=has_bias, dtype=options.dtype)
    layer.weight.data = torch.tensor(weight, dtype=options.dtype)
    if layer.bias is not None:
        layer.bias.data = _bias(node, name, options, weight.shape[0])
    return layer


def _padding(node: Any, name: str, dims: int) -> Any:
    value = node.padding
    if isinstance(value, (str, bytes, np.str_, np.bytes_)):
        text = value.decode() if isinstance(value, (bytes, np.bytes_)) else str(value)
        if text not in ("same", "valid"):
            raise NIRError(f"{_where(node, name, 'padding')}: expected 'same', 'valid' or numbers, got {text!r}")
        return text
    return checks.integers(value, _where(node, name, "padding"), 0, (1, dims))


def _conv(node: Any, name: str, options: _Options) -> nn.Module:
    weight = _floats(node, name, "weight", options)
    dims = {"Conv1d": 1, "Conv2d": 2}[type(node).__name__]
    if weight.ndim != dims + 2 or 0 in weight.shape:
        raise NIRError(f"{_where(node, name, 'weight')}: must be {dims + 2}-D without empty dimensions, got "
                       f"shape {weight.shape}")
    groups = checks.integers(node.groups, _where(node, name, "groups"), 1)[0]
    if weight.shape[0] % groups:
        raise NIRError(f"{_where(node, name, 'groups')}: {groups} groups do not divide the {weight.shape[0]} "
                       "output channels")
    stride, dilation = (checks.integers(getattr(node, f), _where(node, name, f), 1, (1, dims))
                        for f in ("stride", "dilation"))
    padding = _padding(node, name, dims)
    conv: Any = nn.Conv1d if dims == 1 else nn.Conv2d
    layer = conv(weight.shape[1] * groups, weight.shape[0], tuple(weight.shape[2:]), stride=stride,
                 padding=padding, dilation=dilation, groups=groups, bias=True, dtype=options.dtype)
    layer.weight.data = torch.tensor(weight, dtype=options.dtype)
    layer.bias.data = _bias(node, name, options, weight.shape[0])
    return layer


def _flatten(node: Any, name: str, options: _Options) -> nn.Module:
    # NIR counts dimensions without the batch; torch's start at the batch
    start, end = (checks.integers(getattr(node, f), _where(node, name, f), -checks._INT_RANGE + 1)[0]
                  for f in ("start_dim", "end_dim"))
    return nn.Flatten(*(d + 1 if d >= 0 else d for d in (start, end)))


def _pool(node: Any, name: str, options: _Options) -> nn.Module:
    kernel, stride = (checks.integers(getattr(node, f), _where(node, name, f), 1, (1, 2))
                      for f in ("kernel_size", "stride"))
    padding = checks.integers(node.padding, _where(node, name, "padding"), 0, (1, 2))
    kernel, stride, padding = (_two(v) for v in (kernel, stride, padding))
    if any(2 * p > k for p, k in zip(padding, kernel)):
        raise NIRError(f"{_where(node, name, 'padding')}: at most half the kernel size {kernel}, got {padding}")
    if type(node).__name__ == "AvgPool2d":
        return nn.AvgPool2d(kernel, stride, padding)
    return M.SumPool2d(kernel, stride, padding)


def _two(values: tuple[int, ...]) -> tuple[int, int]:
    return (values[0], values[-1])


def _delay(node: Any, name: str, options: _Options) -> nn.Module:
    delay = _floats(node, name, "delay", options)
    if delay.size == 0:
        raise NIRError(f"{_where(node, name, 'delay')}: empty: a Delay needs one delay per neuron (or one for all)")
    steps = delay / options.dt
    if np.any(delay < 0) or not np.all(np.isfinite(steps)):
        raise NIRError(f"{_where(node, name, 'delay')}: delays must be non-negative, and delay / dt finite "
                       f"(dt = {options.dt:g})")
    buffer = (float(steps.max()) + 1 if steps.size else 1.0) * max(1, steps.size)  # values per sample
    if buffer > checks.MAX_DELAY_VALUES:
        raise NIRError(f"{_where(node, name, 'delay')}: the longest delay is {float(steps.max()):.6g} steps of "
                       f"dt = {options.dt:g}: a buffer of {buffer:.6g} values per sample, more than "
                       f"{checks.MAX_DELAY_VALUES} (autocuda.tools.nir.checks.MAX_DELAY_VALUES)")
    whole = np.round(steps)
    if not np.allclose(steps, whole, rtol=0, atol=1e-6):
        raise NIRError(f"node {name!r} (Delay): delay / dt must be whole, non-negative numbers of steps "
                       f"(dt = {options.dt:g}); got {steps.flat[:4]}")
    return M.Delay({"steps": torch.as_tensor(whole, dtype=torch.long)}, dt=options.dt)


NODE_TYPES: Mapping[str, Callable[[Any, str, _Options], nn.Module | Callable[[], nn.Module]]] = {
    "Input": lambda node, name, options: nn.Identity(),
    "Output": lambda node, name, options: nn.Identity(),
    "LIF": _neuron, "IF": _neuron, "CubaLIF": _neuron,
    "LI": _non_spiking(M.LeakyIntegrator, PER_NEURON["LI"]),
    "I": _non_spiking(M.Integrator, PER_NEURON["I"]),
    "CubaLI": _non_spiking(M.CubaLI, PER_NEURON["CubaLI"]),
    "Affine": _affine, "Linear": _affine, "Conv1d": _conv, "Conv2d": _conv, "Flatten": _flatten,
    "AvgPool2d": _pool, "SumPool2d": _pool,
    "Scale": lambda node, name, options: M.Scale(_tensor(node, name, "scale", options)),
    "Threshold": lambda node, name, options: M.Threshold(_tensor(node, name, "threshold", options)),
    "Delay": _delay,
}


# -- the graph ---------------------------------------------------------------------------------------------------
def _flatten_graph(graph: nir.NIRGraph, budget: checks.Budget, prefix: str = "", depth: int = 0
                   ) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """Nodes and edges with every subgraph's nodes inlined as '<subgraph>.<node>'; an edge into (out of) a
    subgraph goes to its Input (from its Output) node. Node names must be strings, edges pairs of existing
    nodes, and no two nodes may end with one name (a top-level 'sub.x' beside subgraph 'sub''s 'x')."""
    import nir

    if depth > checks.MAX_DEPTH:
        raise NIRError(f"subgraph {prefix.rstrip('.')!r}: nested more than {checks.MAX_DEPTH} deep "
                       "(autocuda.tools.nir.checks.MAX_DEPTH)")
    members, edges_in = getattr(graph, "nodes", None), getattr(graph, "edges", None)
    if not isinstance(members, Mapping) or not isinstance(edges_in, (list, tuple)):
        raise NIRError(f"graph {prefix.rstrip('.') or '<graph>'!r}: nodes must be a dict and edges a list")
    nodes: dict[str, Any] = {}
    origin: dict[str, str] = {}  # flat name -> where it came from, for the collision message
    edges: list[tuple[str, str]] = []
    ends: dict[str, tuple[str, str]] = {}  # subgraph -> (its input node, its output node)
    for name, node in members.items():
        if not isinstance(name, str) or not name:
            raise NIRError(f"graph {prefix.rstrip('.') or '<graph>'!r}: node names must be non-empty strings, "
                           f"got {name!r}")
        budget.node(prefix + name)
        if isinstance(node, nir.NIRGraph):
            inner, inner_edges = _flatten_graph(node, budget, f"{prefix}{name}.", depth + 1)
            for inner_name, inner_node in inner.items():
                _add(nodes, origin, inner_name, inner_node, f"node {inner_name[len(prefix) + len(name) + 1:]!r} "
                     f"of subgraph {prefix + name!r}")
            edges.extend(inner_edges)
            ends[name] = (_single(node.inputs, prefix + name, "Input"), _single(node.outputs, prefix + name, "Output"))
        else:
            _count_fields(node, prefix + name, budget)
            _add(nodes, origin, prefix + name, node, f"node {prefix + name!r}")
    budget.edge_count(prefix.rstrip(".") or "<graph>", len(edges_in))
    for edge in edges_in:
        if not (isinstance(edge, (tuple, list)) and len(edge) == 2 and all(isinstance(e, str) for e in edge)):
            raise NIRError(f"graph {prefix.rstrip('.') or '<graph>'!r}: edge {edge!r} is not a pair of node names")
        for end in edge:
            if end not in members:
                raise NIRError(f"graph {prefix.rstrip('.') or '<graph>'!r}: edge {tuple(edge)!r} names node "
                               f"{end!r}, which the graph does not have")
        source, target = edge
        source = f"{source}.{ends[source][1]}" if source in ends else source
        target = f"{target}.{ends[target][0]}" if target in ends else target
        edges.append((prefix + source, prefix + target))
    return nodes, edges


def _add(nodes: dict[str, Any], origin: dict[str, str], name: str, node: Any, where: str) -> None:
    if name in nodes:
        raise NIRError(f"{origin[name]} and {where} would both be node {name!r} of the inlined graph: rename one")
    nodes[name], origin[name] = node, where


def _count_fields(node: Any, name: str, budget: checks.Budget) -> None:
    """Every array field of `node` counted against the limits before any is converted."""
    if not dataclasses.is_dataclass(node):
        return
    for field in dataclasses.fields(node):
        shape = getattr(getattr(node, field.name, None), "shape", None)  # numpy arrays, torch tensors
        if isinstance(shape, tuple):
            budget.field(_where(node, name, field.name), math.prod(int(d) for d in shape))


def _single(found: Mapping[str, Any], graph: str, kind: str) -> str:
    if len(found) != 1:
        raise NIRError(f"subgraph {graph!r}: expected one {kind} node, found {len(found)}")
    return next(iter(found))


def _build(node: Any, name: str, options: _Options) -> nn.Module | Callable[[], nn.Module]:
    """The module of one node (a spiking node's: a function that builds it); what the node's own checks miss and
    torch refuses becomes a NIRError naming it."""
    try:
        return NODE_TYPES[type(node).__name__](node, name, options)
    except AutocudaError:
        raise
    except (ValueError, TypeError, RuntimeError, OverflowError, AttributeError) as error:
        raise NIRError(f"node {name!r} ({type(node).__name__}): {error}") from None


def _field_shapes(node: Any, name: str) -> dict[str, Shape]:
    """The shapes of the node's per-neuron fields (PER_NEURON) that hold dimensions; they must broadcast together."""
    shapes = {field: tuple(int(d) for d in np.shape(getattr(node, field)))
              for field in PER_NEURON.get(type(node).__name__, ())}
    try:
        np.broadcast_shapes(*shapes.values())
    except ValueError:
        listed = ", ".join(f"{field} {shape}" for field, shape in shapes.items())
        raise NIRError(f"node {name!r} ({type(node).__name__}): the shapes of its fields ({listed}) do not broadcast "
                       "together: each field has the node's neuron shape, or one that broadcasts to it") from None
    return {field: shape for field, shape in shapes.items() if shape}


def _finish(built: nn.Module | Callable[[], nn.Module], node: Any, name: str) -> nn.Module:
    if isinstance(built, nn.Module):
        return built
    try:
        return built()
    except AutocudaError:
        raise
    except (ValueError, TypeError, RuntimeError, OverflowError) as error:
        raise NIRError(f"node {name!r} ({type(node).__name__}): {error}") from None


def _options(dt: Any, method: str, dtype: Any, neuron: Mapping[str, Any]) -> _Options:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise NIRError(f"dtype: expected a floating-point torch dtype, got {dtype!r}")
    step = checks.time_step(dt, dtype)
    if method not in METHODS:
        raise NIRError(f"method: expected one of {', '.join(METHODS)}, got {method!r}")
    return _Options(step, method, dtype, neuron)


def from_nir(graph: nir.NIRGraph | str | Path, *, dt: float = 1e-4, method: str = "euler",
             dtype: torch.dtype = torch.float32, step_mode: str = "m", backend: str | None = None,
             surrogate_function: Any = None, detach_reset: bool = False) -> NIRModule:
    """A torch module that runs the NIR graph `graph` (or the file it was written to) with time step `dt`.

    `method`: "euler" (Norse's step; snnTorch's and SpikingJelly's for LIF and IF), "semi_implicit" (Euler with
    CubaLIF's current first: snnTorch's Synaptic, SpikingJelly's CUBALIFNode) or "exact" (x held over a step).
    `backend`, `surrogate_function`, `detach_reset` go to every spiking neuron (`autocuda.nn.Neuron`).
    A graph that breaks a rule or a limit (autocuda.nir.checks) is refused with a NIRError naming the node and
    field, before anything is built; the parameters are copied (the graph's arrays are never shared).
    """
    import nir

    neuron = {"backend": backend, "detach_reset": detach_reset}
    if surrogate_function is not None:
        neuron["surrogate_function"] = surrogate_function
    options = _options(dt, method, dtype, neuron)
    if isinstance(graph, (str, Path)):
        graph = read(graph)
    if not isinstance(graph, nir.NIRGraph):
        raise TypeError(f"graph: expected a nir.NIRGraph or a path to one, got {type(graph).__name__}")
    nodes, edges = _flatten_graph(graph, checks.Budget())
    for name, node in nodes.items():
        if type(node).__name__ not in NODE_TYPES:
            raise NIRError(f"node {name!r} has NIR type {type(node).__name__}, which autocuda.tools.nir does not "
                           f"import (supported: {', '.join(NODE_TYPES)})")
    inputs, outputs = _ends(nodes, "Input", graph), _ends(nodes, "Output", graph)
    input_names = set(inputs)
    into_inputs = [edge for edge in edges if edge[1] in input_names]
    if into_inputs:
        raise NIRError(f"edge {into_inputs[0]!r} ends at Input node {into_inputs[0][1]!r}: inputs take no edges")
    built = {name: _build(node, name, options) for name, node in nodes.items()}  # every node checked first
    shapes = {name: _field_shapes(node, name) for name, node in nodes.items()}
    modules = {name: _finish(module, nodes[name], name) for name, module in built.items()}
    return NIRModule(modules, edges, inputs, outputs, step_mode, shapes=shapes)


def _ends(nodes: Mapping[str, Any], kind: str, graph: Any) -> list[str]:
    """The top-level Input or Output nodes (inlined subgraphs' own ones are inner pass-throughs)."""
    found = [name for name in graph.nodes if type(nodes.get(name)).__name__ == kind]
    if not found:
        raise NIRError(f"graph: no {kind} node")
    return found
