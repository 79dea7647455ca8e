"""What a layer's call (`nn.Neuron` and the layers built on it) reads from and writes to the layer: step inputs,
parameters and states (read afresh each call: users change them between calls), stored states, output, programs.
Functions, not methods: nn.Module's __getattr__ stops CPython specializing lookups on layers, so methods cost more."""
from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from operator import is_, itemgetter
from typing import Any

import torch

from ..call import functional as F
from ..call import mixing
from ..call import program as programs
from ..call.program import (
    Program,
    Programs,
    forward_ad,
    program_key,
    state_class,
    tracing_state,
    transforms_active,
)
from ..runtime.configs import spec_ref
from ..spec.step import SPIKE
from ..spec.surrogate import SURROGATES
from .arguments import BACKENDS, refuse_proxy
from .output import layer_output

Neuron = Any  # `nn.Neuron` and the layers built on it, not imported here


def step_inputs(layer: Neuron, inputs: tuple[Any, ...], min_dim: int
                ) -> tuple[torch.Tensor | tuple[torch.Tensor, ...], torch.Tensor]:
    """The call's step inputs (x, or a tuple of one tensor per input) and the first input, whose shape and dtype the
    states follow; refuses a wrong count, a non-tensor or an unlike shape. `min_dim`: 1 in step mode 'm' ([T] is
    one neuron), 0 in 's'."""
    names = layer.__dict__["_input_names"]
    if len(inputs) == 1 == len(names) and type(inputs[0]) is torch.Tensor and inputs[0].dim() >= min_dim:
        return inputs[0], inputs[0]  # the usual call: one input, checked further by the functional API
    if len(inputs) != len(names):
        raise TypeError(f"{layer.spec.name!r} takes {len(names)} step input(s) ({', '.join(names)}), one tensor "
                        f"each; got {len(inputs)}")
    for name, value in zip(names, inputs):
        label = ("x_seq" if min_dim else "x") if names == ("x",) else name
        if not isinstance(value, torch.Tensor):
            refuse_proxy(layer, value)
            if min_dim:
                raise ValueError(f"{label}: step_mode 'm' expects a tensor of shape [T, *], got "
                                 f"{type(value).__name__}")
            raise TypeError(f"{label}: expected a torch.Tensor, got {type(value).__name__}")
        if value.dim() < min_dim:
            raise ValueError(f"{label}: step_mode 'm' expects a tensor of shape [T, *], got {tuple(value.shape)}")
    first = inputs[0]
    for name, value in zip(names[1:], inputs[1:]):
        if value.shape != first.shape:
            raise ValueError(f"step input {name!r} has shape {tuple(value.shape)} but {names[0]!r} has "
                             f"{tuple(first.shape)}: every step input must have one shape")
    return (first if len(inputs) == 1 else tuple(inputs)), first


def run_sequence(layer: Neuron, x: torch.Tensor | tuple[torch.Tensor, ...], states: list[Any],
                 params: dict[str, Any], compiling: bool, written: bool = False) -> tuple:
    """A multi-step call's (spikes, final states, state sequences: kept where v_seq is stored or the output reads
    a state) by the layer's `Programs`; with the spike as output, keeps its configuration for `run_keyed`
    (`configure`). `written` (`writes_output`): the output-writing variant runs, its spikes the output."""
    d = layer.__dict__
    output = d["_output"]
    keep = not written and (d["_store_v_seq"] or d["_output_reads_states"])
    if compiling or d["recompute"]:
        return F.multi_step(d["_spec_ref"], x, *states, surrogate=d["_surrogate_ref"], detach_reset=d["detach_reset"],
                            store_state_seq=keep, final_states=d["store_final_states"],
                            backend=BACKENDS[d["backend"]], recompute=d["recompute"], save_h=d["save_h"], **params)
    owned = _programs(d)
    spec = written_spec_ref(layer) if written else d["_spec_ref"]
    results, ran = F.run_sequence(owned, spec, x, states, d["_surrogate_ref"], d["detach_reset"], None, keep,
                                  d["store_final_states"], BACKENDS[d["backend"]], d["save_h"], params)
    owned.configured = None if ran is None or keep or output.kind != SPIKE else configure(d, *ran)
    return results


def writes_output(layer: Neuron, x: torch.Tensor, states: Sequence[Any], params: Mapping[str, Any],
                  compiling: bool) -> bool:
    """Whether the kernels that write the output (not the spike) may run a multi-step call (they have no backward)."""
    d = layer.__dict__
    if d["_output"].kind == SPIKE or compiling or d["_store_v_seq"] or d["recompute"]:
        return False
    if mixing.kernel_backend(x, BACKENDS[d["backend"]]) is None:
        return False
    if torch.is_grad_enabled() and (x.requires_grad or any(
            isinstance(v, torch.Tensor) and v.requires_grad for v in (*states, *params.values()))):
        return False
    return True


def written_spec_ref(layer: Neuron) -> str:
    """The spec's variant whose forward kernels write the output in place of the spike, parsed once per spec, lazily."""
    d, spec = layer.__dict__, layer.spec
    found = d.get("_written_spec")
    if found is None or found[0] is not spec:
        found = d["_written_spec"] = (spec, spec_ref(dataclasses.replace(spec, writes_output=True)))
    return found[1]


def run_step(layer: Neuron, x: torch.Tensor | tuple[torch.Tensor, ...], states: list[Any],
             params: dict[str, Any], compiling: bool) -> tuple[torch.Tensor, tuple]:
    """A single-step call's (spike, new states), run by the layer's own programs; with the spike as output and no
    v_seq stored, keeps its configuration for `run_keyed` (`configure`)."""
    d = layer.__dict__
    if compiling:
        return F.single_step(d["_spec_ref"], x, *states, surrogate=d["_surrogate_ref"],
                             detach_reset=d["detach_reset"], backend=BACKENDS[d["backend"]], **params)
    owned = _programs(d)
    results, ran = F.run_step(owned, d["_spec_ref"], x, states, d["_surrogate_ref"], d["detach_reset"], None,
                              BACKENDS[d["backend"]], params)
    owned.configured = None if ran is None or d["_store_v_seq"] or d["_output"].kind != SPIKE else \
        configure(d, *ran)
    return results


def _programs(d: dict[str, Any]) -> Programs:
    """The layer's programs, made on its first call (a layer unpickled or copied has none)."""
    owned = d.get("_programs")
    if owned is None:
        owned = d["_programs"] = Programs()
    return owned


# What a layer's call reads from its dict besides its parameters, states and inputs
_SWITCHES = ("_spec_ref", "_surrogate_ref", "detach_reset", "_store_v_seq", "_output", "backend", "save_h",
             "recompute", "store_final_states")


def configure(d: dict[str, Any], program: Program, values: dict[str, Any]) -> tuple | None:
    """What `run_keyed` needs after `program` ran a call (`values`: its parameters, with defaults): a reader of the
    switches and parameters, the objects it read, the key's configuration part, the first dim of x's neuron shape (1
    for a sequence, 0 for one step), the class of float states, the scalars, where the tensor parameters stand among
    what the reader reads (in the program's order). None where a parameter is neither a plain attribute nor a
    parameter or buffer of the layer (its changes would not show), or the program is unkeyed."""
    names = d["_param_names"]
    if (program.configuration is None or program.launch is None or program.draws or len(program.inputs) != 1
            or not program.bindable):
        return None  # kept by no `Programs`, unbound, tensor parameters not of one value, several inputs, or draws
    plain = tuple(name for name in names if name in d)
    held = tuple(name for name in names if name not in d)
    places = tuple("_parameters" if name in d["_parameters"] else "_buffers" for name in held)
    if any(name not in d[place] for name, place in zip(held, places)):
        return None  # a property, say
    read_plain = itemgetter(*_SWITCHES, *plain)
    read: Any = read_plain
    if held:  # parameters and buffers (ParametricLIF's w), from the dicts of the layer called (a replica's own)
        def read(d: dict[str, Any]) -> tuple:
            return (*read_plain(d), *[d[place][name] for place, name in zip(places, held)])
    order = (*_SWITCHES, *plain, *held)
    picks = tuple(order.index(name) for name, _ in program.tensors)
    floats = (float,) * len(d["_state_names"])
    return (read, read(d), program.configuration, 0 if program.bound_form.single else 1, floats,
            tuple(program.scalar_values(values)), picks)


def run_keyed(layer: Neuron, x: Any, first: int) -> torch.Tensor | None:
    """The spikes of an eager call of one tensor (`first`: 1 for a sequence, 0 for one step) in the step mode of the
    layer's kept configuration (`configure`), from float states (as after a reset) or tensor states of x's neuron shape
    and dtype (as after a call), the tensor parameters (one value each) the very objects the configuration read, by
    the program that the kept part of the key and the call's input class find (`program_key`); else None: the full
    path runs."""
    d = layer.__dict__
    owned = d.get("_programs")
    kept = None if owned is None else owned.configured
    if kept is None or type(x) is not torch.Tensor or not programs.ENABLED or transforms_active() or tracing_state() \
            or forward_ad._current_level >= 0:
        return None
    read, seen, configuration, kept_first, floats, scalars, picks = kept
    if kept_first != first:  # configured by a call in the other step mode
        return None
    try:
        now = read(d)
    except KeyError:  # a parameter that is no plain attribute now (made a Parameter or a buffer): never again
        owned.configured = None
        return None
    if not all(map(is_, now, seen)):
        return None
    names = d["_state_names"]
    numbers: list[Any] = []
    tensors: list[Any] = []
    for name in names:  # a loop: cheaper than map and a set test for a layer's few states
        value = d.get(name)
        if type(value) is float:
            numbers.append(value)
        # a tensor of x's neuron shape and dtype (another restarts at its initial value or is converted: full path)
        elif type(value) is torch.Tensor and value.shape == x.shape[first:] and value.dtype == x.dtype:
            tensors.append(value)
        else:
            return None
    if numbers and tensors:
        return None
    if tensors and torch.is_grad_enabled() and any(map(torch.Tensor.is_inference, tensors)):
        return None  # states kept from a call under torch.inference_mode: the full path copies them (`start_states`)
    try:
        program = owned.get(program_key(configuration, x, state_class(tensors) if tensors else floats))
    except RuntimeError:  # x has no data pointer (a sparse tensor, say): the full path names it
        return None
    if program is None:
        return None
    results = program.run_layer(x, tensors, [*numbers, *scalars], [now[i] for i in picks] if picks else ())
    if not results:
        return None
    for name, value in zip(names, results[1:]):
        d[name] = value
    return results[0]


def surrogate_state(source: Any) -> Any:
    """The kernels' view of a foreign surrogate `source`, cheap to compare (ours report changes: `Surrogate.watch`)."""
    if isinstance(source, str):
        return source
    if isinstance(source, Mapping):
        return tuple(source.items())
    names = getattr(source, "_sg_param_names", None)  # a SpikingJelly surrogate's parameters
    if names is None:
        cls = SURROGATES.get(type(source).__name__)
        names = () if cls is None else [name for name, _ in cls.DEFAULTS]
    return (getattr(source, "spiking", True), *(_plain(getattr(source, name, None)) for name in names))


def _plain(value: Any) -> Any:
    """A tensor parameter's values (compared by value, not identity: changed in place, it is a change), else `value`."""
    return value.tolist() if isinstance(value, torch.Tensor) else value


def sync_surrogate(layer: Neuron) -> None:
    """Take a foreign surrogate_function's values again where they changed (SpikingJelly reads it at every call).
    A torch.compile trace cannot (taking them names new kernels, eager work that Dynamo cannot trace): it refuses, and
    Dynamo runs the call eagerly, which takes them, unless fullgraph=True, where the error reaches the user."""
    foreign = layer.__dict__["_surrogate_foreign"]
    if foreign is not None and surrogate_state(foreign[0]) != foreign[1]:
        if torch.compiler.is_compiling():
            raise RuntimeError(
                f"surrogate_function: the values of {type(foreign[0]).__name__} changed after torch.compile traced "
                f"{type(layer).__name__}, and a traced call cannot take them; assign it again "
                f"(layer.surrogate_function = layer.surrogate_function) or call the layer once without torch.compile, "
                f"or use autocuda's surrogates (autocuda.surrogate), whose changes a layer takes at once")
        layer._use_surrogate(foreign[0])


def store_states(layer: Neuron, names: Sequence[str], values: Sequence[Any], compiling: bool) -> None:
    """Set states (and v_seq): plain attributes (`__init__` refuses clashing names), so eager calls set them in the
    instance dict one by one, skipping nn.Module.__setattr__'s checks (dict.update is dearer)."""
    if compiling:  # callers ask `is_compiling` once; torch.compile traces setattr
        for name, value in zip(names, values):
            setattr(layer, name, value)
    else:
        d = layer.__dict__
        for name, value in zip(names, values):
            d[name] = value


def start_states(layer: Neuron, x: torch.Tensor, first: int, compiling: bool,
                 given: Sequence[Any] | None = None) -> list[torch.Tensor | float]:
    """The states to start from (the layer's, or `given`): numbers as after a reset, or tensors of x's neuron shape (its
    dims from `first` on) in x's dtype; a tensor of another shape restarts at its initial value, as in SpikingJelly."""
    d = layer.__dict__
    values: list[torch.Tensor | float] = []
    shape = None
    for i, name in enumerate(d["_state_names"]):
        if given is not None:
            value = given[i]
        else:  # a plain attribute (see `store_states`), unless a user deleted it or made it a Parameter
            value = d[name] if not compiling and name in d else getattr(layer, name)
        if type(value) is not float:  # devices unchecked (dear): `Module.to` moves states; the op names a stray one
            if not isinstance(value, torch.Tensor):
                values.append(_number(name, value))
                continue
            if shape is None:  # sliced only for tensors
                shape, dtype = x.shape[first:], x.dtype
            if value.shape != shape:
                value = _fresh(layer, name, shape)
                if not isinstance(value, torch.Tensor):
                    values.append(value)
                    continue
            if value.dtype != dtype:  # `to` parses its arguments even to do nothing
                value = value.to(dtype)
            elif not compiling and value.is_inference() and torch.is_grad_enabled():
                # kept from a call under torch.inference_mode: autograd saves no inference tensor, and the kernels'
                # backward may save the initial states (SpikingJelly's nodes go on from them): a normal copy
                value = value.clone()
        values.append(value)
    return values


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"state {name!r}: expected a tensor or a number, got {type(value).__name__}")
    return float(value)


def _fresh(layer: Neuron, name: str, shape: torch.Size) -> torch.Tensor | float:
    """State `name` at its initial value for the neuron shape `shape`."""
    init = layer.__dict__["_initial"][name]
    value = initial_value(layer, init)
    if not isinstance(value, torch.Tensor):
        return value
    try:
        return value.expand(shape).clone()
    except RuntimeError:
        held = f"parameter {init!r}" if isinstance(init, str) else "initial value"
        raise ValueError(f"state {name!r}: its {held} has shape {tuple(value.shape)}, which does not broadcast "
                         f"to the neuron shape {tuple(shape)}") from None


def initial_value(layer: Neuron, init: Any) -> Any:
    """A state's initial value: a named parameter's, detached or copied; v_reset's is 0 where the reset is not hard
    (v_reset=None, or a spec whose reset is soft or none), as the functional calls start it (docs/semantics.md)."""
    if isinstance(init, str):
        if init == "v_reset" and layer.spec.reset != "hard":
            return 0.0
        init = getattr(layer, init)
        init = 0.0 if init is None else init
        return init.detach() if isinstance(init, torch.Tensor) else float(init)
    if isinstance(init, torch.Tensor):
        return init.detach().clone()
    if isinstance(init, (int, float)) and not isinstance(init, bool):
        return float(init)
    return copy.deepcopy(init)


def check_memory(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float, torch.Tensor)):
        raise TypeError(f"{name}: an initial value must be a number or a tensor, got {type(value).__name__}")


def append_v_seq(layer: Neuron, v: torch.Tensor, compiling: bool) -> None:
    """Append one step's membrane to v_seq, starting a new sequence where shape, dtype or device changed."""
    step = v.unsqueeze(0)
    seq = layer.__dict__.get("v_seq")
    if seq is None or seq.shape[1:] != step.shape[1:] or seq.dtype != step.dtype or seq.device != step.device:
        seq = step
    else:
        seq = torch.cat((seq, step))
    store_states(layer, ("v_seq",), (seq,), compiling)


def call_output(layer: Neuron, inputs: torch.Tensor | tuple[torch.Tensor, ...], spike: torch.Tensor,
                states: Sequence[Any] | None, params: dict[str, Any]) -> torch.Tensor:
    """The layer's output (`nn.output`): the spike unless its spec names another. `inputs`: the step inputs; `states`:
    the states after the step (or their sequences) in spec order, or None where the output reads none."""
    output = layer.__dict__["_output"]
    if output.kind == SPIKE:
        return spike
    d = layer.__dict__
    after = {} if states is None else dict(zip(d["_state_names"], states))
    return layer_output(layer.spec, output, inputs, spike, after, params, d["_output_program"])


def read_params(layer: Neuron, compiling: bool) -> dict[str, Any]:
    """The parameters by name as getattr reads them, afresh each call. Eager calls read the instance dict, parameters
    and buffers in getattr's order (nn.Module keeps a name in one at most, none named like a class attribute)."""
    d = layer.__dict__
    names = d["_param_names"]
    if compiling:  # Dynamo traces getattr
        return {name: getattr(layer, name) for name in names}
    parameters, buffers = d["_parameters"], d["_buffers"]
    params = {}
    for name in names:
        if name in d:
            params[name] = d[name]
        elif name in parameters:
            params[name] = parameters[name]
        elif name in buffers:
            params[name] = buffers[name]
        else:  # a parametrization's property, say; the dicts skip nn.Module.__getattr__'s frame
            params[name] = getattr(layer, name)
    return params
