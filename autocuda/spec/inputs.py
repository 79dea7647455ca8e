"""Several step inputs as one: the part of a traced step that reads only its inputs, run before the kernel.

The kernels read one input sequence x. A step with inputs x1, x2, ... fits them when everything it does with its
inputs passes through one value of the inputs alone, u = f(x1, x2, ...) (e.g. `h = v + (x1 + x2 - v) / tau`, or
`x1 - 0.5 * x2`): the step then reads u as x, and u is computed with torch before the kernel, elementwise over the
whole sequence, so autograd carries x's gradient back to each input. A step that reads its inputs in more than
one such value (`g_e * (E_e - v) + g_i * (E_i - v)`, or an input beside a state in two places) is refused, naming
the values. No sympy here: a cached step evaluates its combination with torch alone.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import torch

from ..errors import SpecError
from .trace import Node, Trace

__all__ = ["combine_inputs", "evaluate_inputs", "INPUT"]

INPUT = "x"  # the spec's name of the combined input

# node operation -> positions of its operands that are node ids (see `spec.trace`'s table of nodes)
OPERANDS: Mapping[str, tuple[int, ...]] = {
    "sym": (), "int": (), "float": (), "spike": (), "detached": (),
    **dict.fromkeys(("add", "sub", "mul", "div", "pow", "min", "max"), (1, 2)),
    "neg": (1,), "fn": (2,), "heaviside": (1,), "rel": (2, 3), "where": (1, 2, 3), "ind": (1,),
}


def _operands(node: Node) -> list[int]:
    return [node[i] for i in OPERANDS[node[0]]]


def _reachable(nodes: Sequence[Node], roots: Sequence[int]) -> list[int]:
    """The ids of the nodes `roots` are computed from, in table order (operands before their users)."""
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        i = stack.pop()
        if i not in seen:
            seen.add(i)
            stack.extend(_operands(nodes[i]))
    return sorted(seen)


def _table(nodes: Sequence[Node], keep: Sequence[int], replace: Mapping[int, Node]) -> tuple[tuple[Node, ...],
                                                                                          dict[int, int]]:
    """The nodes `keep` (in order, operands renumbered), with `replace` substituted: (table, old id -> new)."""
    new: dict[int, int] = {}
    table: list[Node] = []
    for i in keep:
        node = replace.get(i, nodes[i])
        if i not in replace:
            node = tuple(new[v] if at in OPERANDS[node[0]] else v for at, v in enumerate(node))
        new[i] = len(table)
        table.append(node)
    return tuple(table), new


def combine_inputs(traced: Trace, inputs: Sequence[str], name: str, origin: str) -> Trace:
    """`traced` (whose `inputs` are the first symbols) reading one input `x`: the value of the inputs alone
    that the rest of the step reads, kept as the trace's `input_nodes` (its last node that value)."""
    nodes = traced.nodes
    symbols = {node[1]: i for i, node in enumerate(nodes) if node[0] == "sym"}
    input_ids = {symbols[n] for n in inputs if n in symbols}
    pure, other = [False] * len(nodes), [False] * len(nodes)  # reads inputs only / reads anything else
    for i, node in enumerate(nodes):
        operands = _operands(node)
        pure[i] = i in input_ids or (any(pure[j] for j in operands) and not any(other[j] for j in operands))
        other[i] = (node[0] in ("sym", "spike", "detached") and i not in input_ids) or any(other[j] for j in operands)
    roots = [*traced.returns, *((traced.spike.argument,) if traced.spike is not None else ())]
    used = _reachable(nodes, roots)
    readers = set(roots) | {j for i in used if not pure[i] for j in _operands(nodes[i])}
    frontier = [i for i in used if pure[i] and i in readers]
    if len(frontier) != 1:
        found = "none" if not frontier else f"{len(frontier)} values of them"
        raise SpecError(f"{name} takes {len(inputs)} step inputs, and the kernels read one input sequence: the step "
                        f"must read its inputs through one value of them alone (e.g. h = v + (x1 + x2 - v) / tau); "
                        f"it reads {found}. Combine the inputs in one expression, or add them before the neuron",
                        source=origin, symbol="inputs")
    combined = frontier[0]
    if nodes[combined][0] == "rel":
        raise SpecError(f"{name}: the step reads its inputs through a condition alone; the kernels read one input "
                        f"value: write the condition on a value, torch.where(x1 + x2 > 0, ...)", source=origin,
                        symbol="inputs")
    step_nodes, renumbered = _table(nodes, [i for i in used if not pure[i] or i == combined],
                                    {combined: ("sym", INPUT)})
    input_nodes, _ = _table(nodes, _reachable(nodes, [combined]), {})
    spike = traced.spike
    if spike is not None:
        spike = dataclasses.replace(spike, argument=renumbered[spike.argument])
    return dataclasses.replace(traced, nodes=step_nodes, returns=tuple(renumbered[i] for i in traced.returns),
                               spike=spike, names=(INPUT, *traced.names[len(inputs):]), inputs=tuple(inputs),
                               input_nodes=input_nodes)


_TORCH: Mapping[str, Callable[..., torch.Tensor | float]] = {
    "add": lambda v, a, b: v[a] + v[b], "sub": lambda v, a, b: v[a] - v[b], "mul": lambda v, a, b: v[a] * v[b],
    "div": lambda v, a, b: v[a] / v[b], "pow": lambda v, a, b: v[a] ** v[b], "neg": lambda v, a: -v[a],
    "min": lambda v, a, b: torch.minimum(*_tensors(v[a], v[b])),
    "max": lambda v, a, b: torch.maximum(*_tensors(v[a], v[b])),
    "fn": lambda v, name, a: getattr(torch, name)(v[a]),
    "heaviside": lambda v, a: (v[a] >= 0).to(v[a].dtype),
    "rel": lambda v, op, a, b: getattr(torch, op)(*_tensors(v[a], v[b])),
    "where": lambda v, rel, a, b: _where(v[rel], *_tensors(v[a], v[b])),
    "int": lambda v, n: n, "float": lambda v, f: f,
}


def _where(condition: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.where(condition, a, b)


def _tensors(*values: torch.Tensor | float) -> list[torch.Tensor]:
    anchor = next(v for v in values if isinstance(v, torch.Tensor))
    return [v if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=anchor.dtype, device=anchor.device)
            for v in values]


def evaluate_inputs(nodes: Sequence[Node], names: Sequence[str], values: Sequence[torch.Tensor]) -> torch.Tensor:
    """The combined input: `nodes` (the trace's input_nodes) over the inputs `values`, with torch."""
    given = dict(zip(names, values))
    results: list[torch.Tensor | float] = []
    for node in nodes:
        if node[0] == "sym":
            results.append(given[node[1]])
        elif node[0] == "ind":  # a condition as 0/1, in the inputs' dtype
            results.append(results[node[1]].to(values[0].dtype))
        else:
            results.append(_TORCH[node[0]](results, *node[1:]))
    out = results[-1]
    if not isinstance(out, torch.Tensor):
        raise TypeError("the combined input reads no input tensor")
    return out
