"""`Neuron`: a layer of neurons of any spec, as a `torch.nn.Module`.

A layer keeps its states between calls as attributes named after the spec's states (`self.v`, `self.w`, ...):
a number until the first call, then tensors of the neuron shape. `reset()` restores the initial values
(SpikingJelly's `functional.reset_net` calls it). step_mode 's' takes x [*], 'm' takes x [T, *]; a spec with
several step inputs (`NeuronSpec.inputs`, e.g. g_e and g_i) takes one tensor per input, in the spec's order and
all of one shape: `layer(g_e, g_i)`. A state
tensor of another shape than the input's neuron shape starts afresh from its initial value, as SpikingJelly's
nodes do (a new batch size needs no reset).

SpikingJelly's state protocol (`base.MemoryModule`), without depending on SpikingJelly: the states are the
layer's memories (`memories()`, `named_memories()`, `register_memory` adds more, `set_reset_value`,
`get_reset_value`), `detach()` cuts their graphs (`functional.detach_net`: truncated BPTT), and
`functional_forward(inputs, states)` runs a step from explicit states, leaving the layer's own untouched.
Where SpikingJelly is installed, `Neuron` is a subclass of its `base.MemoryModule`, so that its free functions
(`to_functional_forward`, `extract_memories`, ...), which pick modules by `isinstance`, see our layers.

`backend`: None picks the kernels for CUDA tensors (the reference on CPU); SpikingJelly's 'torch' means our
torch-op reference, its 'cupy' our kernels (compiled by NVRTC, launched through the CUDA driver).
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from operator import is_, itemgetter
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .. import functional as F
from .. import native, prepared
from ..runtime.plans import resolve_spec, spec_ref, surrogate_ref
from ..spec.model import NeuronSpec
from ..spec.step import SPIKE
from ..surrogate import Sigmoid, get_surrogate
from .output import layer_output, spec_output

__all__ = ["Neuron", "SIGMOID"]

_BACKENDS = {None: None, "auto": None, "torch": "reference", "reference": "reference", "cupy": "cuda",
             "cuda": "cuda", "host": "host"}
_UNSET: Any = object()
SIGMOID = Sigmoid()  # the default surrogate (SpikingJelly's); surrogates are immutable, so one object serves all


def _memory_module_base() -> type[nn.Module]:
    """SpikingJelly's `base.MemoryModule` where SpikingJelly is installed (importing that module alone costs under
    a millisecond and imports nothing else of SpikingJelly's), else `nn.Module`."""
    try:
        from spikingjelly.activation_based.base import MemoryModule
    except ImportError:
        return nn.Module
    return MemoryModule if isinstance(MemoryModule, type) and issubclass(MemoryModule, nn.Module) else nn.Module


if TYPE_CHECKING:
    _Base = nn.Module
else:
    _Base = _memory_module_base()


class Neuron(_Base):
    """A layer of neurons of any spec: `Neuron('lif', tau=3.0)`, `Neuron(my_spec, v_reset=None)`.

    Parameters are the spec's (floats, tensors broadcast over neurons, or `nn.Parameter`s, which are learned;
    the spec's learnable parameters become `nn.Parameter`s by default). `v_reset=None` means a soft reset.
    `options` sets the spec's compile-time options; `initial` overrides states' initial values.
    `surrogate_function=None` takes the spec's surrogate (its `[surrogate]` table; Sigmoid(4) without one).
    `recompute=True` (an attribute of every layer, also set later) keeps only a multi-step call's arguments for
    backward, which runs the forward again (`functional.multi_step`): less memory, one more forward.
    `save_h=False` (likewise) saves no h in a multi-step call: backward replays it from x, which it keeps instead
    (`functional.multi_step`): fewer bytes moved, the same memory.
    """

    # nn.Module's own attribute handling, also where SpikingJelly's MemoryModule is the base:
    # MemoryModule's versions keep memories in a dict of its own, which this class does not use
    if not TYPE_CHECKING:  # mypy would read it as a class variable, not as the attribute hook it is
        __getattr__ = nn.Module.__getattr__
    __setattr__ = nn.Module.__setattr__
    __delattr__ = nn.Module.__delattr__
    __dir__ = nn.Module.__dir__
    _replicate_for_data_parallel = nn.Module._replicate_for_data_parallel
    step_mode: str = "s"  # a plain attribute of each layer (this hides StepModule's property where it is a base)
    recompute: bool = False  # layers built without it (SpikingJelly's signatures, older pickles) read this
    save_h: bool = True      # likewise

    def __init__(self, spec: NeuronSpec | str, *, surrogate_function: Any = None, detach_reset: bool = False,
                 step_mode: str = "s", store_v_seq: bool = False, backend: str | None = None,
                 options: Mapping[str, bool] | None = None, initial: Mapping[str, float] | None = None,
                 recompute: bool = False, save_h: bool = True, **params: Any):
        nn.Module.__init__(self)  # not MemoryModule's (where it is the base): it sets the dict this class lacks
        spec = resolve_spec(spec)
        self.spec = spec.with_options(**options) if options else spec
        if step_mode not in ("s", "m"):
            raise ValueError(f"step_mode: expected 's' (single step) or 'm' (multi step), got {step_mode!r}")
        if backend not in _BACKENDS:
            raise ValueError(f"backend: expected one of {[b for b in _BACKENDS if b]} or None, got {backend!r}")
        for name, flag in (("detach_reset", detach_reset), ("store_v_seq", store_v_seq), ("recompute", recompute),
                           ("save_h", save_h)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name}: expected True or False, got {flag!r}")
        if surrogate_function is None:
            surrogate_function = self.spec.surrogate
        self.surrogate_function = surrogate_function
        self._surrogate = get_surrogate(surrogate_function)
        # References by string: what torch.compile's Dynamo can pass around as constants (see runtime.plans)
        self._spec_ref, self._surrogate_ref = spec_ref(self.spec), surrogate_ref(self._surrogate)
        self._state_names = self._memory_names = tuple(s.name for s in self.spec.states)
        self._input_names = self.spec.inputs
        self._output = spec_output(self.spec)  # the spike, unless the spec names another output
        self.detach_reset, self.step_mode, self.store_v_seq = bool(detach_reset), step_mode, bool(store_v_seq)
        self.recompute, self.save_h = recompute, save_h
        self.backend = backend
        self._param_names = tuple(p.name for p in self.spec.params)
        self._set_params(params)
        states = {s.name: s.init for s in self.spec.states}
        unknown = set(initial or {}) - set(states)
        if unknown:
            raise TypeError(f"initial: {sorted(unknown)[0]!r} is not a state of {self.spec.name!r} "
                            f"(states: {', '.join(states)})")
        self._initial: dict[str, Any] = {**states, **(initial or {})}
        for name in states:
            if hasattr(type(self), name) or name in self._param_names:
                raise ValueError(f"state {name!r} of {self.spec.name!r} clashes with an attribute of {type(self)}")
        self.reset()

    def __setstate__(self, state: dict[str, Any]) -> None:
        nn.Module.__setstate__(self, state)
        self.__dict__.setdefault("_output", spec_output(self.spec))
        self.__dict__.setdefault("_input_names", self.spec.inputs)
        self.__dict__.setdefault("recompute", False)
        self.__dict__.setdefault("save_h", True)
        # References name objects registered in the process that built the layer (unpickling: register here)
        self._spec_ref, self._surrogate_ref = spec_ref(self.spec), surrogate_ref(self._surrogate)

    def _set_params(self, params: Mapping[str, Any]) -> None:
        unknown = [n for n in params if n not in self._param_names]
        if unknown:
            raise TypeError(f"unknown parameter {unknown[0]!r} for neuron {self.spec.name!r} "
                            f"(parameters: {', '.join(self._param_names)})")
        for p in self.spec.params:
            value = params.get(p.name, _UNSET)
            if value is _UNSET:
                value = nn.Parameter(torch.tensor(p.default)) if p.learnable else p.default
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                p.check(value)
            elif not isinstance(value, (int, float, torch.Tensor)) and (value is not None or p.name != "v_reset"):
                raise TypeError(f"{p.name}: expected a number or a tensor, got {type(value).__name__}"
                                + (" (None is for v_reset only: a soft reset)" if value is None else ""))
            if isinstance(value, nn.Parameter):
                self.register_parameter(p.name, value)
            elif isinstance(value, torch.Tensor):
                self.register_buffer(p.name, value)
            else:
                setattr(self, p.name, value)

    # -- state ----------------------------------------------------------------------------------------
    @property
    def state_names(self) -> tuple[str, ...]:
        return self._state_names

    def reset(self) -> None:
        """Restore every state to its initial value (a number, or the value of the parameter it names)."""
        # Stores as `_set_states` does, inline, with `is_compiling` asked once
        compiling = torch.compiler.is_compiling()
        d = self.__dict__
        for name, init in d["_initial"].items():  # by state, in order
            value = _initial_value(self, init)
            if compiling:
                setattr(self, name, value)
            else:
                d[name] = value
        if compiling:
            self.v_seq = None
        else:
            d["v_seq"] = None

    def detach(self) -> None:
        """Cut the states' (and v_seq's) autograd graphs, keeping their values: SpikingJelly's
        `functional.detach_net` calls it between the chunks of truncated BPTT."""
        d = self.__dict__
        for name in (*d["_memory_names"], "v_seq"):
            value = d.get(name)
            if isinstance(value, torch.Tensor):
                d[name] = value.detach()

    # -- SpikingJelly's memory protocol ----------------------------------------------------------------
    def register_memory(self, name: str, value: Any) -> None:
        """Add a memory that `reset()` restores to `value` (SpikingJelly's `MemoryModule.register_memory`)."""
        if not isinstance(name, str) or not name.isidentifier() or hasattr(self, name):
            raise ValueError(f"register_memory: {name!r} is not a free attribute name of {type(self).__name__}")
        self._memory_names = (*self._memory_names, name)
        self.set_reset_value(name, value)
        self.__dict__[name] = _initial_value(self, self._initial[name])

    def set_reset_value(self, name: str, value: Any) -> None:
        """The value `reset()` gives the memory `name` from now on (a copy of `value`)."""
        if name not in self._memory_names:
            raise KeyError(f"set_reset_value: {name!r} is not a memory of this layer "
                           f"(memories: {', '.join(self._memory_names)})")
        if name in self._state_names:  # a registered memory may hold anything, as SpikingJelly's
            _check_memory(name, value)
        self._initial[name] = value.detach().clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)

    def get_reset_value(self, name: str) -> Any:
        """The value `reset()` gives the memory `name` (a parameter's current value where the spec names one)."""
        if name not in self._memory_names:
            raise KeyError(f"get_reset_value: {name!r} is not a memory of this layer "
                           f"(memories: {', '.join(self._memory_names)})")
        return _initial_value(self, self._initial[name])

    @property
    def _memories(self) -> dict[str, Any]:
        """The memories by name: what SpikingJelly's `to_functional_forward` counts (a copy; set them by name)."""
        return dict(self.named_memories())

    def memories(self) -> Iterator[Any]:
        for _, value in self.named_memories():
            yield value

    def named_memories(self) -> Iterator[tuple[str, Any]]:
        """(name, value) of every state, in the spec's order (the membrane first), then registered memories."""
        for name in self._memory_names:
            yield name, getattr(self, name)

    def materialize_states(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...],
                           step_mode: str) -> tuple[Any, ...]:
        """The states a call on `inputs` starts from: numbers kept, tensors of another neuron shape restarted
        at their initial values, others cast to the input's dtype."""
        n = len(self._state_names)
        if len(states) != len(self._memory_names):
            raise ValueError(f"states: expected {len(self._memory_names)} ({', '.join(self._memory_names)}), "
                             f"got {len(states)}")
        first = 1 if step_mode == "m" else 0
        fitted = _states(self, inputs[0], first, torch.compiler.is_compiling(), states[:n])
        return (*fitted, *states[n:])

    def single_step_functional_forward(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...],
                                       **kwargs: Any) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
        """One step from explicit `states` (as `named_memories` orders them): ((output,), new states)."""
        return self._functional(inputs, states, multi=False)

    def multi_step_functional_forward(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...],
                                      **kwargs: Any) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
        """T steps from explicit `states`: ((output_seq,), final states)."""
        return self._functional(inputs, states, multi=True)

    def functional_forward(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...],
                           **kwargs: Any) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
        """A call in this layer's step mode from explicit `states`; the layer's own states are not touched."""
        if self.step_mode not in ("s", "m"):
            raise ValueError(f"step_mode: expected 's' or 'm', got {self.step_mode!r}")
        states = self.materialize_states(inputs, tuple(states), self.step_mode)
        if self.step_mode == "m":
            return self.multi_step_functional_forward(inputs, states, **kwargs)
        return self.single_step_functional_forward(inputs, states, **kwargs)

    def _functional(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...], *, multi: bool
                    ) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
        if not isinstance(inputs, (tuple, list)):
            raise TypeError(f"inputs: expected a tuple holding the input tensor(s), got {type(inputs).__name__}")
        given, x = _step_inputs(self, tuple(inputs), 2 if multi else 0)
        n = len(self._state_names)
        compiling = torch.compiler.is_compiling()
        params = _params(self, compiling)
        run: Callable[..., Any] = F.multi_step if multi else F.single_step
        extra = {"store_state_seq": self._output.kind != SPIKE, "recompute": self.recompute,
                 "save_h": self.save_h} if multi else {}
        out = run(self._spec_ref, given, *states[:n], surrogate=self._surrogate_ref,
                  detach_reset=self.detach_reset, backend=_BACKENDS[self.backend], **extra, **params)
        after = out[2] if multi else out[1]  # the state sequences, or the new states
        return (_output(self, given, out[0], after, params),), (*out[1], *states[n:])

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Module.to() and friends move tensor states with the parameters (as SpikingJelly's memories)."""
        d = self.__dict__
        for name in d["_memory_names"]:
            if isinstance(d.get(name), torch.Tensor):
                d[name] = fn(d[name])
        return nn.Module._apply(self, fn, *args, **kwargs)  # not MemoryModule's (where it is the base)

    # -- forward --------------------------------------------------------------------------------------
    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        """One step (step_mode 's': each input [*]) or a sequence ('m': each [T, *]); one tensor per step input
        of the spec (x alone for most)."""
        if self.step_mode == "m":
            return self.multi_step_forward(*inputs)
        if self.step_mode == "s":
            return self.single_step_forward(*inputs)
        raise ValueError(f"step_mode: expected 's' or 'm', got {self.step_mode!r}")

    def single_step_forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        given, x = _step_inputs(self, inputs, 0)
        compiling = torch.compiler.is_compiling()  # asked once a call (see `_set_states`)
        params = _params(self, compiling)
        spike, new_states = F.single_step(self._spec_ref, given, *_states(self, x, 0, compiling),
                                          surrogate=self._surrogate_ref, detach_reset=self.detach_reset,
                                          backend=_BACKENDS[self.backend], **params)
        _set_states(self, self._state_names, new_states, compiling)
        if self.store_v_seq:  # SpikingJelly's single steps append the membrane to v_seq until a reset
            _append_v_seq(self, new_states[0], compiling)
        return _output(self, given, spike, new_states, params)

    def multi_step_forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        compiling = torch.compiler.is_compiling()  # asked once a call (see `_set_states`)
        if not compiling and len(inputs) == 1:
            spikes = _repeat(self, inputs[0])
            if spikes is not None:
                return spikes
        given, x_seq = _step_inputs(self, inputs, 2)
        params = _params(self, compiling)
        states = _states(self, x_seq, 1, compiling)
        spikes, finals, seqs = (None if compiling else _again(self, given, states, params)) or F.multi_step(
            self._spec_ref, given, *states, surrogate=self._surrogate_ref, detach_reset=self.detach_reset,
            store_state_seq=self.store_v_seq or self._output.kind != SPIKE, backend=_BACKENDS[self.backend],
            recompute=self.recompute, save_h=self.save_h, **params)
        if finals is not None:  # always: this module keeps its final states
            _set_states(self, self._state_names, finals, compiling)
        if seqs is not None and self.store_v_seq:
            _set_states(self, ("v_seq",), seqs[:1], compiling)
        return _output(self, given, spikes, seqs, params)

    def extra_repr(self) -> str:
        params = []
        for name in self._param_names:
            value = getattr(self, name)
            if isinstance(value, torch.Tensor):
                kind = "Parameter" if isinstance(value, nn.Parameter) else "tensor"
                value = f"{kind}{list(value.shape)}" if value.numel() != 1 else f"{kind}({float(value):.4g})"
            params.append(f"{name}={value}")
        options = [f"{n}={v}" for n, v in self.spec.options]
        return ", ".join([f"spec={self.spec.name!r}", *params, *options, f"surrogate={self._surrogate!r}",
                          f"detach_reset={self.detach_reset}", f"step_mode={self.step_mode!r}",
                          f"store_v_seq={self.store_v_seq}", f"backend={self.backend!r}",
                          *(["recompute=True"] if self.recompute else []), *([] if self.save_h else ["save_h=False"])])



# The helpers of a layer's call below are functions, not methods: nn.Module's __getattr__ keeps CPython from
# specializing attribute and method lookups on layers, so a method's lookup costs more than a function's;
# `self.__dict__` is read once for the names that follow.

def _step_inputs(layer: Neuron, inputs: tuple[Any, ...], min_dim: int
                 ) -> tuple[torch.Tensor | tuple[torch.Tensor, ...], torch.Tensor]:
    """What a call passes on as its step inputs (x alone, or a tuple of one tensor per input) and the first
    input, whose shape and dtype the states follow; a wrong count, a non-tensor or a shape unlike the first's
    is refused naming the input. `min_dim`: 2 in step mode 'm' ([T, *]), 0 in 's'."""
    names = layer.__dict__["_input_names"]
    if len(inputs) == 1 == len(names) and type(inputs[0]) is torch.Tensor and inputs[0].dim() >= min_dim:
        return inputs[0], inputs[0]  # the usual call: one input, checked further by the functional API
    if len(inputs) != len(names):
        raise TypeError(f"{layer.spec.name!r} takes {len(names)} step input(s) ({', '.join(names)}), one tensor "
                        f"each; got {len(inputs)}")
    for name, value in zip(names, inputs):
        label = ("x_seq" if min_dim else "x") if names == ("x",) else name
        if not isinstance(value, torch.Tensor):
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


def _again(layer: Neuron, x: torch.Tensor | tuple[torch.Tensor, ...], states: list[Any], params: dict[str, Any]
           ) -> tuple | None:
    """An eager multi-step call's results where it runs the layer's last prepared call again, or where it is
    prepared now (`prepared.layer_multi_step`); else None (recompute, or a call the full path runs)."""
    d = layer.__dict__
    if d["recompute"]:
        return None
    last = d.get("_last_call")
    if last is None:  # made on the first ask: a layer unpickled without one has none
        last = d["_last_call"] = prepared.LastCall()
    results = prepared.layer_multi_step(last, d["_spec_ref"], x, tuple(states), d["_surrogate_ref"],
                                        d["detach_reset"], d["store_v_seq"] or d["_output"].kind != SPIKE,
                                        _BACKENDS[d["backend"]], d["save_h"], params)
    if results is not None and isinstance(x, torch.Tensor):
        last.settled = _settle(d, last.prepared, x, params)
    return results


# What a layer's call reads from its dict besides its parameters, states and inputs
_SWITCHES = ("_spec_ref", "_surrogate_ref", "detach_reset", "store_v_seq", "_output", "backend", "save_h", "recompute")


def _settle(d: dict[str, Any], call: prepared.Prepared | None, x: torch.Tensor, params: dict[str, Any]
            ) -> tuple | None:
    """What `_repeat` needs to run the layer's last prepared call (`call`, just run with `params`) again: the
    native operator, plan and scalars, and the switches' and parameters' values, which must be the same objects
    for these to hold. None where the layer keeps more than final states, a parameter is not a plain attribute
    (a parameter, a buffer or a property, which can change without a new object in the dict), or the call has no
    native plan."""
    names = d["_param_names"]
    if call is None or d["store_v_seq"] or d["_output"].kind != SPIKE or not all(name in d for name in names):
        return None
    made = call.settled(x, params)
    if made is None:
        return None
    read = itemgetter(*_SWITCHES, *names)
    return (native.layer_operator(), *made, read, read(d))


def _repeat(layer: Neuron, x: Any) -> torch.Tensor | None:
    """The spikes of an eager multi-step call that reruns the layer's settled call (`_settle`), or None where it
    cannot: no settled call, a switch or parameter that is not the object it was, a state that is not a float (a
    reset gives floats), the prepared or native path turned off, a functorch transform, or an x the native plan was
    not made for (the operator checks x)."""
    d = layer.__dict__
    last = d.get("_last_call")
    settled = None if last is None else last.settled
    if settled is None or type(x) is not torch.Tensor or not (prepared.ENABLED and native.USE) or (
            prepared.transforms_active()):
        return None
    run, plan, scalars, read, seen = settled
    if not all(map(is_, read(d), seen)):
        return None
    names = d["_state_names"]
    numbers = [d.get(name) for name in names]
    if not all(type(value) is float for value in numbers):
        return None
    results = run(plan, x, [*numbers, *scalars])
    if not results:
        return None
    for name, value in zip(names, results[1:]):
        d[name] = value
    return results[0]


def _set_states(layer: Neuron, names: Sequence[str], values: Sequence[Any], compiling: bool) -> None:
    """Set states (and v_seq). These are plain attributes, never parameters, buffers or modules (`__init__`
    refuses clashing state names), so eager calls store them in the instance's dict: nn.Module.__setattr__'s
    checks (isinstance against Parameter in Python, three dict lookups) are skipped, and the states are stored
    one by one (dearer with dict.update). Callers ask `is_compiling` once; torch.compile traces the usual setattr."""
    if compiling:
        for name, value in zip(names, values):
            setattr(layer, name, value)
    else:
        d = layer.__dict__
        for name, value in zip(names, values):
            d[name] = value


def _states(layer: Neuron, x: torch.Tensor, first: int, compiling: bool,
            given: Sequence[Any] | None = None) -> list[torch.Tensor | float]:
    """The states to start from (the layer's, or `given`), for x whose dims from `first` on are the neuron
    shape: numbers (as after a reset: the kernels start from them directly), or tensors of the neuron shape
    in x's dtype. A tensor of another shape starts afresh from its initial value, as SpikingJelly's nodes do
    (a new batch size; an initial value held by a broadcast parameter). Devices are not compared here (a
    call would pay for it): `Module.to` moves the states (`_apply`), and the op names a state on another
    device."""
    d = layer.__dict__
    values: list[torch.Tensor | float] = []
    shape = None
    for i, name in enumerate(d["_state_names"]):
        if given is not None:
            value = given[i]
        else:  # a plain attribute (see `_set_states`), unless a user deleted it or made it a Parameter
            value = d[name] if not compiling and name in d else getattr(layer, name)
        if type(value) is not float:
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
        values.append(value)
    return values


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"state {name!r}: expected a tensor or a number, got {type(value).__name__}")
    return float(value)


def _fresh(layer: Neuron, name: str, shape: torch.Size) -> torch.Tensor | float:
    """State `name` at its initial value for the neuron shape `shape`."""
    init = layer.__dict__["_initial"][name]
    value = _initial_value(layer, init)
    if not isinstance(value, torch.Tensor):
        return value
    try:
        return value.expand(shape).clone()
    except RuntimeError:
        held = f"parameter {init!r}" if isinstance(init, str) else "initial value"
        raise ValueError(f"state {name!r}: its {held} has shape {tuple(value.shape)}, which does not broadcast "
                         f"to the neuron shape {tuple(shape)}") from None


def _initial_value(layer: Neuron, init: Any) -> Any:
    """An initial value as a state holds it: a parameter's value where `init` names one (0 for v_reset=None:
    v = v_reset under a soft reset starts at 0), a float, a detached copy of a tensor, else a deep copy."""
    if isinstance(init, str):
        init = getattr(layer, init)
        init = 0.0 if init is None else init
        return init.detach() if isinstance(init, torch.Tensor) else float(init)
    if isinstance(init, torch.Tensor):
        return init.detach().clone()
    if isinstance(init, (int, float)) and not isinstance(init, bool):
        return float(init)
    return copy.deepcopy(init)


def _check_memory(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float, torch.Tensor)):
        raise TypeError(f"{name}: an initial value must be a number or a tensor, got {type(value).__name__}")


def _append_v_seq(layer: Neuron, v: torch.Tensor, compiling: bool) -> None:
    """Append one step's membrane to v_seq, starting a new sequence where shape, dtype or device changed."""
    step = v.unsqueeze(0)
    seq = layer.__dict__.get("v_seq")
    if seq is None or seq.shape[1:] != step.shape[1:] or seq.dtype != step.dtype or seq.device != step.device:
        seq = step
    else:
        seq = torch.cat((seq, step))
    _set_states(layer, ("v_seq",), (seq,), compiling)


def _output(layer: Neuron, inputs: torch.Tensor | tuple[torch.Tensor, ...], spike: torch.Tensor,
            states: Sequence[Any] | None, params: dict[str, Any]) -> torch.Tensor:
    """The layer's output (see `nn.output`): the spike unless its spec names another output; `inputs` are the
    call's step inputs (x, or one tensor per input), `states` the states after the step (or their sequences),
    in the spec's order."""
    output = layer.__dict__["_output"]
    if output.kind == SPIKE:
        return spike
    assert states is not None  # the callers ask for the state sequences where the output reads them
    return layer_output(layer.spec, output, inputs, spike, dict(zip(layer.__dict__["_state_names"], states)),
                        params)


def _params(layer: Neuron, compiling: bool) -> dict[str, Any]:
    """The parameters by name, as getattr reads them, read afresh on every call (users change them between
    calls). Eager calls look in the instance's dict, then in the parameters and buffers, as getattr and then
    nn.Module.__getattr__ do, without the latter's Python frame. nn.Module keeps a name
    in one of these dicts at most (its __setattr__ moves names between them) and refuses to register a parameter
    or buffer named like a class attribute, which getattr would read first; a name in none of them (a
    parametrization's property, say) is left to getattr."""
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
        else:
            params[name] = getattr(layer, name)
    return params
