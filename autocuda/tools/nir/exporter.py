"""Torch models with our neurons -> NIR graph (`to_nir`).

Exported: an `NIRModule` (what `from_nir` returns: its own graph, with the parameters it holds now), or a
chain of modules (`nn.Sequential`, nested ones inlined, or a single module) of nn.Linear, nn.Conv1d/2d,
nn.Flatten, nn.AvgPool2d, the modules of autocuda.nir.modules, and `Neuron`s whose spec has a NIR equivalent
(`NEURON_EXPORTS`: the shipped lif, parametric_lif, if, cuba_lif, and the specs of autocuda.nir.specs). Shapes
come from one step of `sample_input` ([B, *]) through the model, run without the modules' hooks (a Monitor sees
nothing), whose states are restored afterwards. A module used twice in a chain is a node per use, its parameters
copied; a stateful one (a neuron) used twice is refused (its uses share one state, NIR's nodes have their own).
NIR stores no initial state: a neuron whose states start elsewhere than an import starts them (LIF, CubaLIF:
v = v_leak; IF: v = v_reset; i = 0) is refused, as is a Flatten of the batch dimension. Refusals are NIRErrors.

Our discrete specs count time in steps; NIR in seconds: a time constant of tau steps is tau * dt seconds.
NIR's neurons spike where v > v_threshold: a spec with fires_at ">" exports exactly, one with ">=" (the shipped
specs' default) as the same node, which differs from it only where v lands exactly on the threshold.
lif: tau dv/dt = (v_reset - v) + r x with r = 1 (decay_input) or tau, whose Euler step is our charge exactly.
if: r = 1 / dt. cuba_lif (time unit time_step): tau_mem = tau dt / time_step, same for tau_syn, r = R,
v_leak = v_rest, w_in = tau_syn.
"""
from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from torch import nn

from ...base.errors import NIRError
from ...nn.neuron import Neuron
from ...spec.load import load_spec
from ...spec.model import NeuronSpec
from . import checks
from . import modules as M
from .graph import NIRModule
from .specs import NEURONS, spec_kind

if TYPE_CHECKING:
    import nir

__all__ = ["to_nir", "NEURON_EXPORTS"]

Shape = tuple[int, ...]


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    """A float64 copy of `tensor`: a node never shares memory with the model (nor with another node)."""
    return tensor.detach().cpu().double().numpy().copy()


def _array(value: Any, shape: Shape) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = _numpy(value)
    return np.broadcast_to(np.asarray(value, dtype=np.float64), shape).copy()


def _hard_reset(layer: Neuron) -> Any:
    if layer.v_reset is None:
        raise NIRError(f"{layer.spec.name!r} layer with a soft reset (v_reset=None): NIR has only a hard reset")
    return layer.v_reset


def _lif(layer: Neuron, shape: Shape, dt: float, tau: Any) -> nir.NIRNode:
    import nir

    decay_input = dict(layer.spec.options).get("decay_input", True)
    v_reset = _array(_hard_reset(layer), shape)
    tau = _array(tau, shape)
    return nir.LIF(tau=tau * dt, r=np.ones(shape) if decay_input else tau, v_leak=v_reset,
                   v_threshold=_array(layer.v_threshold, shape), v_reset=v_reset)


def _parametric_lif(layer: Neuron, shape: Shape, dt: float) -> nir.NIRNode:
    return _lif(layer, shape, dt, 1 / torch.sigmoid(torch.as_tensor(layer.w)))


def _if(layer: Neuron, shape: Shape, dt: float) -> nir.NIRNode:
    import nir

    return nir.IF(r=np.full(shape, 1 / dt), v_threshold=_array(layer.v_threshold, shape),
                  v_reset=_array(_hard_reset(layer), shape))


def _cuba_lif(layer: Neuron, shape: Shape, dt: float) -> nir.NIRNode:
    import nir

    scale = dt / _array(layer.time_step, shape)
    tau_syn = _array(layer.tau_syn, shape)
    return nir.CubaLIF(tau_syn=tau_syn * scale, tau_mem=_array(layer.tau, shape) * scale, r=_array(layer.R, shape),
                       v_leak=_array(layer.v_rest, shape), v_threshold=_array(layer.v_threshold, shape),
                       v_reset=_array(_hard_reset(layer), shape), w_in=tau_syn)


NEURON_EXPORTS: Mapping[str, Callable[[Neuron, Shape, float], Any]] = {
    "lif": lambda layer, shape, dt: _lif(layer, shape, dt, layer.tau),
    "parametric_lif": _parametric_lif, "if": _if, "cuba_lif": _cuba_lif,
}


def _neuron(layer: Neuron, shape: Shape, dt: float) -> nir.NIRNode:
    node = _neuron_node(layer, shape, dt)
    _check_starts(layer, node, shape)
    return node


def _neuron_node(layer: Neuron, shape: Shape, dt: float) -> nir.NIRNode:
    import nir

    found = spec_kind(layer.spec)
    if found is not None:  # a NIR spec: its parameters are NIR's, in seconds
        kind = found[0]
        return getattr(nir, kind)(**{f: _array(getattr(layer, f), shape) for f in NEURONS[kind][0]})
    export = NEURON_EXPORTS.get(layer.spec.name)
    if export is not None and not _is_shipped(layer.spec):
        raise NIRError(f"neuron spec {layer.spec.name!r} is not the shipped {layer.spec.name!r} (same name, other "
                       "equations): it has no NIR equivalent")
    if export is None:
        raise NIRError(f"neuron spec {layer.spec.name!r} has no NIR equivalent (exported specs: "
                       f"{', '.join(NEURON_EXPORTS)} and those of autocuda.tools.nir)")
    return export(layer, shape, dt)


def _check_starts(layer: Neuron, node: nir.NIRNode, shape: Shape) -> None:
    """NIR stores no initial state: an import starts each state where its node type says (autocuda.nir.specs:
    LIF, CubaLIF v = v_leak, IF v = v_reset, i = 0), so a layer whose states start elsewhere is refused."""
    kind = type(node).__name__
    fields, starts, _ = NEURONS[kind]
    for state, start in starts.items():
        ours = _array(layer.get_reset_value(state), shape)
        theirs = np.broadcast_to(getattr(node, start) if start in fields else float(start), shape)
        if not np.array_equal(ours, theirs):
            raise NIRError(f"{layer.spec.name!r} layer: state {state!r} starts at {_values(ours)}, where an import "
                           f"of its NIR {kind} starts at {start} = {_values(theirs)}: NIR stores no initial state")


def _values(array: np.ndarray) -> str:
    return f"{array.flat[0]:g}" if array.size and np.all(array == array.flat[0]) else "per-neuron values"


def _is_shipped(spec: NeuronSpec) -> bool:
    """Whether `spec` is the shipped spec of its name, with any options and either comparison (`fires_at`)."""
    shipped = dataclasses.replace(load_spec(spec.name), fires_at=spec.fires_at)
    if {name for name, _ in spec.options} != {name for name, _ in shipped.options}:
        return False
    return spec.with_options(**dict(shipped.options)) == shipped if shipped.options else spec == shipped


def _conv(module: nn.Conv1d | nn.Conv2d, shape: Shape) -> nir.NIRNode:
    import nir

    if module.padding_mode != "zeros":
        raise NIRError(f"{type(module).__name__} with padding_mode={module.padding_mode!r}: NIR convolutions pad "
                       "with zeros")
    weight = _numpy(module.weight)
    bias = _numpy(module.bias) if module.bias is not None else np.zeros(weight.shape[0])
    one_d = isinstance(module, nn.Conv1d)
    return (nir.Conv1d if one_d else nir.Conv2d)(
        input_shape=shape[1] if one_d else shape[1:], weight=weight, stride=module.stride[0] if one_d else
        module.stride, padding=module.padding[0] if one_d and not isinstance(module.padding, str) else
        module.padding, dilation=module.dilation[0] if one_d else module.dilation, groups=module.groups, bias=bias)


def _avg_pool(module: nn.AvgPool2d, shape: Shape) -> nir.NIRNode:
    import nir

    if module.ceil_mode or module.divisor_override is not None or (np.any(module.padding)
                                                                   and not module.count_include_pad):
        raise NIRError("AvgPool2d with ceil_mode, divisor_override or count_include_pad=False: NIR's AvgPool2d "
                       "has none of these")
    return nir.AvgPool2d(kernel_size=_two(module.kernel_size), stride=_two(module.stride),
                         padding=_two(module.padding))


def _two(value: Any) -> np.ndarray:
    return np.broadcast_to(np.asarray(value, dtype=np.int64), (2,)).copy()


def _linear(module: nn.Linear, shape: Shape) -> nir.NIRNode:
    import nir

    weight = _numpy(module.weight)
    if module.bias is None:
        return nir.Linear(weight=weight)
    return nir.Affine(weight=weight, bias=_numpy(module.bias))


def _flatten(module: nn.Flatten, shape: Shape) -> nir.NIRNode:
    import nir

    dims = len(shape) + 1  # torch's dimensions of the input: the batch, then `shape`
    if 0 in (d + dims if d < 0 else d for d in (module.start_dim, module.end_dim)):
        given = ", ".join(["B", *map(str, shape)])
        raise NIRError(f"Flatten(start_dim={module.start_dim}, end_dim={module.end_dim}) of an input [{given}] "
                       "flattens the batch dimension: NIR's Flatten keeps the batch apart")
    start, end = (d - 1 if d > 0 else d for d in (module.start_dim, module.end_dim))
    return nir.Flatten(input_type={"input": np.array(shape)}, start_dim=start, end_dim=end)


def _get(name: str) -> Callable[[nn.Module], np.ndarray]:
    return lambda module: _numpy(getattr(module, name))


def _nir(kind: str, **fields: Callable[[Any], Any]) -> Callable[[nn.Module, Shape], nir.NIRNode]:
    """An exporter that builds nir.<kind> with each field read from the module."""
    def build(module: nn.Module, shape: Shape) -> nir.NIRNode:
        import nir

        return getattr(nir, kind)(**{name: get(module) for name, get in fields.items()})
    return build


MODULE_EXPORTS: Mapping[type, Callable[[Any, Shape], Any]] = {
    nn.Linear: _linear, nn.Conv1d: _conv, nn.Conv2d: _conv, nn.Flatten: _flatten, nn.AvgPool2d: _avg_pool,
    M.LeakyIntegrator: _nir("LI", tau=_get("tau"), r=_get("r"), v_leak=_get("v_leak")),
    M.Integrator: _nir("I", r=_get("r")),
    M.CubaLI: _nir("CubaLI", **{k: _get(k) for k in ("tau_syn", "tau_mem", "r", "v_leak", "w_in")}),
    M.Scale: _nir("Scale", scale=_get("scale")),
    M.Threshold: _nir("Threshold", threshold=_get("threshold")),
    M.SumPool2d: _nir("SumPool2d", kernel_size=lambda m: np.array(m.kernel_size), stride=lambda m: np.array(m.stride),
                      padding=lambda m: np.array(m.padding)),
    M.Delay: _nir("Delay", delay=lambda m: _numpy(m.steps) * m.dt),
}


def _check_step(module: nn.Module, dt: float, where: str) -> None:
    """A layer that steps its NIR equations in seconds (a `nir_*` spec's `time_step`, the torch modules' `dt`) is
    exported only with its own step: NIR stores no step, and an import at `dt` would run it at that one."""
    if isinstance(module, Neuron):
        if spec_kind(module.spec) is None:
            return
        own: Any = module.time_step
    elif isinstance(module, M.StepModule):
        own = module.dt
    else:
        return
    steps = _numpy(own) if isinstance(own, torch.Tensor) else np.asarray(own, dtype=np.float64)
    if not np.allclose(steps, dt, rtol=1e-9, atol=0):
        found = f"{steps.flat[0]:g}" if steps.size and np.all(steps == steps.flat[0]) else "per-neuron values"
        raise NIRError(f"module {where!r} ({type(module).__name__}) steps its NIR equations with dt = {found} s, "
                       f"not the export's dt = {dt:g} s: NIR stores no time step, and the graph imported with dt = "
                       f"{dt:g} would be another network; pass the module's dt to to_nir")


def _node(module: nn.Module, shape: Shape, dt: float, where: str) -> nir.NIRNode:
    _check_step(module, dt, where)
    try:
        if isinstance(module, Neuron):
            return _neuron(module, shape, dt)
        export = MODULE_EXPORTS.get(type(module))
        if export is None:
            raise NIRError(f"{type(module).__name__} has no NIR equivalent (exported: Neuron, "
                           f"{', '.join(t.__name__ for t in MODULE_EXPORTS)}, nn.Sequential, NIRModule)")
        return export(module, shape)
    except ValueError as error:
        raise NIRError(f"module {where!r}: {error}") from None


# -- shapes and structure ----------------------------------------------------------------------------------------
# A module's own hooks, hidden from the sample step: what a Monitor (or any hook) sees is the model's runs alone
_HOOKS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
          "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks")


def _input_shapes(model: nn.Module, sample: torch.Tensor) -> tuple[dict[int, list[Shape]], Shape]:
    """The input shapes without the batch of each module's calls in call order, by id(module), and the output's:
    one step of the model from its initial states, with none of the modules' hooks, after which every module's
    attributes (states, step modes, switches, hooks) and buffers are restored."""
    saved = {module: (dict(module.__dict__), dict(module._buffers)) for module in model.modules()}
    shapes: dict[int, list[Shape]] = {}

    def record(module: nn.Module, args: tuple[Any, ...], out: Any) -> None:
        shapes.setdefault(id(module), []).append(_shape(args))

    try:
        for module in saved:
            for name in _HOOKS:
                if name in module.__dict__:
                    module.__dict__[name] = OrderedDict()
            module.register_forward_hook(record)
            if hasattr(module, "step_mode"):
                cast(Any, module).step_mode = "s"
            reset = getattr(module, "reset", None)
            if callable(reset):
                reset()
        with torch.no_grad():
            out = model(sample)
    finally:
        for module, (attributes, buffers) in saved.items():
            module.__dict__.clear()
            module.__dict__.update(attributes)
            module._buffers.clear()
            module._buffers.update(buffers)
    if not isinstance(out, torch.Tensor):
        raise NIRError("model: to_nir exports models with one output tensor")
    return shapes, tuple(out.shape[1:])


def _shape(args: tuple[Any, ...]) -> Shape:
    return tuple(args[0].shape[1:]) if args and isinstance(args[0], torch.Tensor) else ()


def _chain(model: nn.Module, prefix: str = "") -> list[tuple[str, nn.Module]]:
    """The modules of a chain in call order (nested Sequentials inlined), a module used twice at each use."""
    if isinstance(model, nn.Sequential):
        return [item for name, child in model._modules.items() if child is not None
                for item in _chain(child, f"{prefix}{name}.")]
    return [] if isinstance(model, (nn.Identity, nn.Dropout)) else [(prefix.rstrip("."), model)]


def _uses(uses: list[tuple[str, nn.Module]], shapes: dict[int, list[Shape]]) -> list[Shape]:
    """The input shape of each use (where, module), in call order. A stateful module (a neuron) used twice is
    refused: its uses share one state, where NIR's nodes each have their own."""
    count: dict[int, int] = {}
    found = []
    for where, module in uses:
        index = count[id(module)] = count.get(id(module), -1) + 1
        if index and hasattr(module, "step_mode"):
            raise NIRError(f"module {where!r} ({type(module).__name__}) is a stateful module used a second time: "
                           "its uses share one state, where NIR's nodes each have their own; use a layer per use")
        calls = shapes.get(id(module), [])
        if index >= len(calls):
            raise NIRError(f"module {where!r} ({type(module).__name__}) was not run by the model on the sample "
                           "input as often as it appears (a chain runs its modules in order)")
        found.append(calls[index])
    return found


def _bypass(edges: list[tuple[str, str]], passing: list[str]) -> list[tuple[str, str]]:
    """The edges with each pass-through node (an inlined subgraph's Input or Output) left out: an edge into one
    becomes, in its place, one edge to each of its targets, so that every path keeps its sum and the edges their
    order (which decides the edges that close cycles)."""
    for name in passing:
        targets = [t for s, t in edges if s == name and t != name]
        edges = [(s, t2) for s, t in edges if s != name for t2 in (targets if t == name else [t])]
    return list(edges)


def to_nir(model: nn.Module, sample_input: torch.Tensor, *, dt: float = 1e-4) -> nir.NIRGraph:
    """The NIR graph of `model` for time step `dt` (seconds per step); `sample_input` is one step, [B, *]."""
    import nir

    dt = checks.time_step(dt)
    if not isinstance(sample_input, torch.Tensor) or sample_input.dim() < 2:
        raise NIRError("sample_input: expected one time step of input, a tensor [B, *]")
    shapes, out_shape = _input_shapes(model, sample_input)
    if isinstance(model, NIRModule):
        passing = [name for name in model.names if name not in model.inputs and name not in model.outputs
                   and type(model.module(name)) is nn.Identity]
        run = [(name, model.module(name)) for name in model.order  # the nodes the sample step called, in order
               if name not in model.inputs and type(model.module(name)) is not nn.Identity]
        found = dict(zip((name for name, _ in run), _uses(run, shapes)))
        left_out, nodes = set(passing), {}
        for name in model.names:
            if name in model.inputs:
                nodes[name] = nir.Input(input_type=np.array(sample_input.shape[1:]))
            elif name in model.outputs:
                nodes[name] = nir.Output(output_type=np.array(out_shape))
            elif name not in left_out:  # pass-through nodes are left out (see _bypass)
                nodes[name] = _node(model.module(name), found[name], dt, name)
        return nir.NIRGraph(nodes=nodes, edges=_bypass(model.edges, passing), type_check=False)
    chain = _chain(model)
    if not chain:
        raise NIRError("model: nothing to export (an empty chain)")
    names = ["input", *(path.replace(".", "_") or "module" for path, _ in chain), "output"]
    nodes = {"input": nir.Input(input_type=np.array(sample_input.shape[1:]))}
    uses = [(path or type(module).__name__, module) for path, module in chain]
    for name, (where, module), shape in zip(names[1:], uses, _uses(uses, shapes)):
        nodes[name] = _node(module, shape, dt, where)
    nodes["output"] = nir.Output(output_type=np.array(out_shape))
    return nir.NIRGraph(nodes=nodes, edges=list(zip(names[:-1], names[1:])), type_check=False)
