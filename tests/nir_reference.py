"""A direct float64 simulation of NIR's equations: the judge where a framework (ours or a peer) and NIR differ.

Written from NIR's documentation (https://neuroir.org/docs/primitives.html), not from autocuda.nir: every neuron
is stepped with Euler (v' = v + dt f(v, x), every state from its start-of-step value; `current_first`: CubaLIF's
and CubaLI's current is stepped first and the membrane with the new current), spikes where v > v_threshold, and
a spiking neuron's membrane is then set to v_reset. Membranes start at v_leak (IF at v_reset, I at 0), currents
at 0. A node's input is the sum of its sources' outputs; an edge that closes a cycle (in a depth-first walk from
the inputs) carries the previous step's output (nothing at the first step). Subgraphs are inlined.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import nir
import numpy as np


def flatten(graph: nir.NIRGraph, prefix: str = "") -> tuple[dict[str, Any], list[tuple[str, str]]]:
    nodes: dict[str, Any] = {}
    edges: list[tuple[str, str]] = []
    ends: dict[str, tuple[str, str]] = {}
    for name, node in graph.nodes.items():
        if isinstance(node, nir.NIRGraph):
            inner, inner_edges = flatten(node, f"{prefix}{name}.")
            nodes.update(inner)
            edges += inner_edges
            ends[name] = (next(iter(node.inputs)), next(iter(node.outputs)))
        else:
            nodes[prefix + name] = node
    for source, target in graph.edges:
        source = f"{source}.{ends[source][1]}" if source in ends else source
        target = f"{target}.{ends[target][0]}" if target in ends else target
        edges.append((prefix + source, prefix + target))
    return nodes, edges


def _order(nodes: Mapping[str, Any], edges: list[tuple[str, str]], inputs: list[str]
           ) -> tuple[list[str], set[tuple[str, str]]]:
    successors: dict[str, list[str]] = {name: [] for name in nodes}
    for source, target in edges:
        successors[source].append(target)
    on_path: set[str] = set()
    done: set[str] = set()
    post: list[str] = []
    back: set[tuple[str, str]] = set()

    def visit(name: str) -> None:
        on_path.add(name)
        for target in successors[name]:
            if target in on_path:
                back.add((name, target))
            elif target not in done:
                visit(target)
        on_path.discard(name)
        done.add(name)
        post.append(name)

    for name in inputs:
        if name not in done:
            visit(name)
    return post[::-1], back


def _f(node: Any, name: str) -> np.ndarray:
    return np.asarray(getattr(node, name), dtype=np.float64)


def _spike(node: Any, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    z = v > _f(node, "v_threshold")
    return z.astype(np.float64), np.where(z, _f(node, "v_reset"), v)


def _step(node: Any, x: np.ndarray, state: dict[str, np.ndarray], dt: float, current_first: bool) -> np.ndarray:
    kind = type(node).__name__
    if kind in ("Input", "Output"):
        return x
    if kind in ("Affine", "Linear"):
        return x @ _f(node, "weight").T + (_f(node, "bias") if kind == "Affine" else 0.0)
    if kind == "Scale":
        return x * _f(node, "scale")
    if kind == "Threshold":
        return (x > _f(node, "threshold")).astype(np.float64)
    if kind == "Flatten":
        start, end = (int(node.start_dim) + 1, int(node.end_dim))
        end = end + 1 if end >= 0 else x.ndim + end
        return x.reshape(*x.shape[:start], -1, *x.shape[end + 1:])
    if kind in ("LIF", "LI"):
        v = state.get("v", np.broadcast_to(_f(node, "v_leak"), x.shape))
        v = v + dt / _f(node, "tau") * (_f(node, "v_leak") - v + _f(node, "r") * x)
    elif kind in ("IF", "I"):
        v = state.get("v", np.broadcast_to(_f(node, "v_reset") if kind == "IF" else 0.0, x.shape))
        v = v + dt * _f(node, "r") * x
    elif kind in ("CubaLIF", "CubaLI"):
        v = state.get("v", np.broadcast_to(_f(node, "v_leak"), x.shape))
        i = state.get("i", np.zeros(x.shape))
        new_i = i + dt / _f(node, "tau_syn") * (_f(node, "w_in") * x - i)
        v = v + dt / _f(node, "tau_mem") * (_f(node, "v_leak") - v + _f(node, "r") * (new_i if current_first else i))
        state["i"] = new_i
    else:
        raise ValueError(f"the reference simulator has no {kind}")
    if kind in ("LIF", "IF", "CubaLIF"):
        z, v = _spike(node, v)
        state["v"] = v
        return z
    state["v"] = v
    return v


def simulate(graph: nir.NIRGraph, x: np.ndarray, dt: float, current_first: bool = False) -> np.ndarray:
    """The outputs [T, B, *] of `graph` (one Input, one Output) for inputs x [T, B, *] in float64."""
    nodes, edges = flatten(graph)
    inputs = [name for name in graph.nodes if isinstance(graph.nodes[name], nir.Input)]
    output = next(name for name in graph.nodes if isinstance(graph.nodes[name], nir.Output))
    order, back = _order(nodes, edges, inputs)
    states: dict[str, dict[str, np.ndarray]] = {name: {} for name in nodes}
    previous: dict[str, np.ndarray] = {}
    out = []
    for x_t in np.asarray(x, dtype=np.float64):
        values = {inputs[0]: x_t}
        for name in order:
            if name in inputs:
                continue
            arriving = [values[s] for s, t in edges if t == name and (s, t) not in back]
            arriving += [previous[s] for s, t in edges if t == name and (s, t) in back and s in previous]
            values[name] = _step(nodes[name], sum(arriving[1:], arriving[0]), states[name], dt, current_first)
        previous = values
        out.append(values[output])
    return np.stack(out)
