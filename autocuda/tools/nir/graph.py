"""`NIRModule`: runs a graph of torch modules in the order of its edges, with recurrence.

A node's input is the sum of its predecessors' outputs. Edges that close a cycle (found by a depth-first walk
from the inputs, in the graph's node order) carry the output of the previous time step (nothing at the first
step). A graph without such edges runs each node once over the whole sequence (neurons in step_mode 'm': one
fused kernel per layer); a graph with them runs one time step at a time through every node (step_mode 's').
Stateless nodes see [T * B, *] in the first case and [B, *] in the second; stateful ones (those with a
`step_mode`: our neurons, autocuda.nir.modules) get [T, B, *] or [B, *]. The edges that reach a node must
carry one shape (they are summed, never broadcast); a node's per-neuron fields (`shapes`) must broadcast to its
input's neuron shape (without time and batch) without growing it; a node that fails on its input raises a NIRError
naming it. An empty sequence (T = 0) runs no step: empty outputs [0, B, *], every state as it was.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import torch
from torch import nn

from ...base.errors import AutocudaError, NIRError

__all__ = ["NIRModule"]


def _stateful(module: nn.Module) -> bool:
    return hasattr(module, "step_mode")


def _walk(names: Sequence[str], edges: Sequence[tuple[str, str]], inputs: Sequence[str]
          ) -> tuple[list[str], set[tuple[str, str]]]:
    """(evaluation order, back edges): reverse post-order of a depth-first walk from the inputs, each node's
    successors in the order of the edges. The walk keeps its own stack: a chain of any length is walked."""
    successors: dict[str, list[str]] = {name: [] for name in names}
    for source, target in edges:
        successors[source].append(target)
    on_path: set[str] = set()
    done: set[str] = set()
    post: list[str] = []
    back: set[tuple[str, str]] = set()
    for start in inputs:
        if start in done:
            continue
        on_path.add(start)
        stack = [(start, iter(successors[start]))]
        while stack:
            name, pending = stack[-1]
            following = next(pending, None)
            if following is None:  # every successor seen: the node is done
                stack.pop()
                on_path.discard(name)
                done.add(name)
                post.append(name)
            elif following in on_path:
                back.add((name, following))
            elif following not in done:
                on_path.add(following)
                stack.append((following, iter(successors[following])))
    unreachable = [name for name in names if name not in done]
    if unreachable:
        raise NIRError(f"graph: node {unreachable[0]!r} cannot be reached from the inputs {list(inputs)}")
    return post[::-1], back


_RESERVED = frozenset(dir(nn.ModuleDict()))  # attributes of a ModuleDict ('keys', 'training'): no module keys


def _keys(names: Sequence[str]) -> dict[str, str]:
    """A distinct ModuleDict key per node name: the name with '.' as '__' (keys hold no dots), and where that key
    is taken (by 's__x' beside 's.x'), empty, or an attribute of nn.ModuleDict ('keys', 'training'), the first of
    key_2, key_3, ... that is free. Keys follow the node order, so that an import always gets the same."""
    keys: dict[str, str] = {}
    taken: set[str] = set()
    for name in names:
        base = name.replace(".", "__") or "_"
        key, count = base, 1
        while key in taken or key in _RESERVED:
            count += 1
            key = f"{base}_{count}"
        keys[name] = key
        taken.add(key)
    return keys


class NIRModule(nn.Module):
    """A graph of modules: `nodes` by name, `edges` (source, target), named `inputs` and `outputs`.

    step_mode 'm' (default): forward(x [T, B, *]) -> [T, B, *]; 's': forward(x [B, *]) -> [B, *], one step,
    keeping every state until `reset()`. Several inputs: pass a dict by input name; several outputs come back
    as a dict by output name. `shapes`: per node, the shapes of its per-neuron fields by field name.
    """

    def __init__(self, nodes: Mapping[str, nn.Module], edges: Sequence[tuple[str, str]], inputs: Sequence[str],
                 outputs: Sequence[str], step_mode: str = "m",
                 shapes: Mapping[str, Mapping[str, tuple[int, ...]]] | None = None):
        super().__init__()
        self.names = list(nodes)
        self.keys = _keys(self.names)
        self.nodes = nn.ModuleDict({self.keys[name]: module for name, module in nodes.items()})
        self.edges = [(source, target) for source, target in edges]
        self.inputs, self.outputs = list(inputs), list(outputs)
        for end in [*(end for edge in self.edges for end in edge), *self.inputs, *self.outputs]:
            if end not in nodes:
                raise NIRError(f"graph: node {end!r} (of an edge, the inputs or the outputs) does not exist")
        self.order, self.back_edges = _walk(self.names, self.edges, self.inputs)
        self.sources: dict[str, list[str]] = {name: [] for name in self.names}
        for source, target in self.edges:  # one pass over the edges: graphs of thousands of nodes and edges
            self.sources[target].append(source)
        self.shapes = {name: dict(fields) for name, fields in (shapes or {}).items()}
        # Per node after the inputs, in order: (name, ModuleDict key, sources this step, sources of the previous
        # step, per-neuron fields' shapes): what `_run` reads per call, so that a call walks no edge lists
        self._plan = [(name, self.keys[name], tuple(s for s in self.sources[name] if (s, name) not in self.back_edges),
                       tuple(s for s in self.sources[name] if (s, name) in self.back_edges),
                       tuple(self.shapes.get(name, {}).items()))
                      for name in self.order if name not in self.inputs]
        self._previous: dict[str, torch.Tensor] = {}
        self.step_mode = step_mode

    @property
    def recurrent(self) -> bool:
        return bool(self.back_edges)

    @property
    def step_mode(self) -> str:
        return self._step_mode

    @step_mode.setter
    def step_mode(self, mode: str) -> None:
        if mode not in ("s", "m"):
            raise ValueError(f"step_mode: expected 's' (one step) or 'm' (a sequence), got {mode!r}")
        self._step_mode = mode
        inner = "m" if mode == "m" and not self.recurrent else "s"
        for module in self.nodes.values():
            if _stateful(module):
                cast(Any, module).step_mode = inner

    def module(self, name: str) -> nn.Module:
        """The module of node `name`."""
        return self.nodes[self.keys[name]]

    def reset(self) -> None:
        """Start again: every state to its initial value, no previous outputs on recurrent edges."""
        self._previous = {}
        for module in self.nodes.values():
            reset = getattr(module, "reset", None)
            if callable(reset):
                reset()

    def forward(self, x: torch.Tensor | Mapping[str, torch.Tensor]) -> torch.Tensor | dict[str, torch.Tensor]:
        given = self._named_inputs(x)
        if self._step_mode == "s":
            return self._pack(self._run(given, 1))
        if not self.recurrent:
            return self._pack(self._run(given, 2))
        if _length(given) == 0:
            return self._pack(self._no_step(given))
        steps = [self._run({k: v[t] for k, v in given.items()}, 1) for t in range(_length(given))]
        return self._pack({name: _stack(name, [step[name] for step in steps]) for name in self.outputs})

    def _no_step(self, given: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The empty outputs [0, B, *] of an empty sequence: the graph run over it as a sequence (each layer in step
        mode 'm' runs no step), the recurrent edges carrying nothing; states and previous outputs are kept."""
        previous = self._previous
        modes = {module: cast(Any, module).step_mode for module in self.nodes.values() if _stateful(module)}
        try:
            self._previous = {}
            for module in modes:
                cast(Any, module).step_mode = "m"
            return self._run(given, 2)
        finally:
            self._previous = previous
            for module, mode in modes.items():
                cast(Any, module).step_mode = mode

    def _named_inputs(self, x: torch.Tensor | Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if isinstance(x, torch.Tensor):
            if len(self.inputs) != 1:
                raise ValueError(f"x: this graph has inputs {self.inputs}; pass a dict of tensors by input name")
            return {self.inputs[0]: x}
        missing = set(self.inputs) - set(x)
        if missing:
            raise ValueError(f"x: missing input {sorted(missing)[0]!r} (inputs: {self.inputs})")
        return dict(x)

    def _pack(self, outputs: dict[str, torch.Tensor]) -> torch.Tensor | dict[str, torch.Tensor]:
        return outputs[self.outputs[0]] if len(self.outputs) == 1 else outputs

    def _run(self, given: Mapping[str, torch.Tensor], batch_dims: int) -> dict[str, torch.Tensor]:
        """Every node once, in order; batch_dims 2: tensors are [T, B, *], 1: [B, *] (one step)."""
        values = {name: given[name] for name in self.inputs}
        modules = self.nodes._modules  # the ModuleDict's own dict: no key check per node
        for name, key, sources, recurrent, fields in self._plan:
            arriving = [values[source] for source in sources]
            # a recurrent edge: the previous step's output (none at the first step)
            arriving += [self._previous[source] for source in recurrent if source in self._previous]
            if not arriving:  # fed only by recurrent edges, at the first step
                raise NIRError(f"node {name!r} has no input at the first step (only recurrent edges reach it)")
            module = modules[key]
            try:
                total = arriving[0]
                for value in arriving[1:]:
                    if value.shape != total.shape:  # a sum of edges, not a broadcast
                        raise NIRError(f"node {name!r} gets inputs of shapes {[tuple(v.shape) for v in arriving]}: "
                                       "the edges that reach a node must carry one shape")
                    total = total + value
                if fields:
                    _fit(name, fields, tuple(total.shape[batch_dims:]))
                values[name] = total if type(module) is nn.Identity else _call(module, total, batch_dims)
            except (AutocudaError, torch.cuda.OutOfMemoryError):
                raise
            except (RuntimeError, ValueError, TypeError, IndexError) as error:
                shapes = [tuple(value.shape) for value in arriving]
                raise NIRError(f"node {name!r} ({type(module).__name__}) fails on its input (shapes {shapes}): "
                               f"{error}") from error
        if self.recurrent:
            self._previous = {source: values[source] for source, _ in self.back_edges}
        return {name: values[name] for name in self.outputs}


def _fit(name: str, fields: tuple[tuple[str, tuple[int, ...]], ...], neurons: tuple[int, ...]) -> None:
    """Each per-neuron field of a node broadcasts to its input's neuron shape without growing it: a longer or larger
    shape would be broadcast over the batch (one value per sample)."""
    for field, shape in fields:
        if len(shape) > len(neurons) or any(f not in (1, n) for f, n in zip(shape[::-1], neurons[::-1])):
            raise NIRError(f"node {name!r}: field {field!r} has shape {shape}, which does not fit the neuron shape "
                           f"{neurons} of its input (without time and batch): a field has the node's neuron shape, "
                           "or one that broadcasts to it")


def _call(module: nn.Module, x: torch.Tensor, batch_dims: int) -> torch.Tensor:
    if batch_dims == 1 or _stateful(module):
        return module(x)
    y = module(x.flatten(0, 1))  # [T * B, *]: one call over the whole sequence
    return y.unflatten(0, x.shape[:2])


def _stack(name: str, steps: list[torch.Tensor]) -> torch.Tensor:
    shapes = {tuple(step.shape) for step in steps}
    if len(shapes) > 1:
        raise NIRError(f"output {name!r} changes shape from step to step ({sorted(shapes)}): a node's shape follows "
                       "its inputs, which a recurrent edge changed")
    return torch.stack(steps)


def _length(given: Mapping[str, torch.Tensor]) -> int:
    lengths = {value.shape[0] for value in given.values()}
    if len(lengths) != 1:
        raise ValueError(f"x: every input needs the same number of time steps, got {sorted(lengths)}")
    return lengths.pop()
