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
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..base.switches import check_switches
from ..call import functional as F
from ..runtime.configs import resolve_spec, spec_ref, surrogate_ref
from ..spec.model import NeuronSpec, Param
from ..spec.surrogate import Sigmoid, Surrogate, get_surrogate
from .arguments import BACKENDS, check_backend
from .layer_call import (
    append_v_seq,
    call_output,
    check_memory,
    initial_value,
    read_params,
    run_keyed,
    run_sequence,
    run_step,
    start_states,
    step_inputs,
    store_states,
    surrogate_state,
    sync_surrogate,
    writes_output,
)
from .memory import MemoryBase, MemoryViews, detach_memories
from .output import output_program, reads_states, spec_output

__all__ = ["Neuron", "SIGMOID", "option_attribute"]

# a layer's switches: True or False, when set too
FLAGS = ("detach_reset", "store_v_seq", "recompute", "save_h", "store_final_states")

_UNSET: Any = object()
# The default surrogate (SpikingJelly's), frozen: each layer given it changes a copy of its own (SpikingJelly's
# nodes share their default object, so that set_spiking_mode on one node's default changes them all)
SIGMOID = Sigmoid().frozen()


def _check_param(param: Param, value: Any) -> None:
    """Refuse a value of a type no call takes for `param`: a number (bools not), a tensor, or None for v_reset (a soft
    reset). A number's domain is checked by the constructor and by each call (SpikingJelly's ILIFNode builds with any
    threshold)."""
    if isinstance(value, torch.Tensor) or (value is None and param.name == "v_reset"):
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{param.name}: expected a number or a tensor, got {type(value).__name__}"
                        + (" (None is for v_reset only: a soft reset)" if value is None else ""))


class Neuron(MemoryViews, MemoryBase):
    """A layer of neurons of any spec: `Neuron('lif', tau=3.0)`, `Neuron(my_spec, v_reset=None)`.

    Parameters are the spec's (floats, tensors broadcast over neurons, or `nn.Parameter`s, which are learned;
    the spec's learnable parameters become `nn.Parameter`s by default). `v_reset=None` means a soft reset.
    `options` sets the spec's compile-time options; `initial` overrides states' initial values (a number, or the name
    of a parameter or attribute whose value each reset reads).
    `surrogate_function=None` takes the spec's surrogate (its `[surrogate]` table; Sigmoid(4) without one).
    `recompute=True` (an attribute of every layer, also set later) keeps only a multi-step call's arguments for
    backward, which runs the forward again (`functional.multi_step`): less memory, one more forward.
    `save_h=False` (likewise) saves no h in a multi-step call: backward replays it from x, which it keeps instead
    (`functional.multi_step`): fewer bytes moved, the same memory.
    `store_final_states=False` (likewise) keeps no states after a multi-step call: the kernels write none and the
    layer's states stay as they were (after a reset: their initial values), so each multi-step call starts from
    them, as after `reset()`. For training that resets the layers every batch: the final states' memory (and,
    under torch.compile, their zero gradients) is not held through backward. Single steps keep their states.
    """

    # nn.Module's own attribute handling, also where SpikingJelly's MemoryModule is the base:
    # MemoryModule's versions keep memories in a dict of its own, which this class does not use
    if not TYPE_CHECKING:  # mypy would read it as a class variable, not as the attribute hook it is
        __getattr__ = nn.Module.__getattr__
    __delattr__ = nn.Module.__delattr__
    __dir__ = nn.Module.__dir__
    _replicate_for_data_parallel = nn.Module._replicate_for_data_parallel
    step_mode: str = "s"  # a plain attribute of each layer (this hides StepModule's property where it is a base)
    recompute: bool = False  # layers built without it (SpikingJelly's signatures, older pickles) read this
    save_h: bool = True      # likewise
    store_final_states: bool = True  # likewise

    def __init__(self, spec: NeuronSpec | str, *, surrogate_function: Any = None, detach_reset: bool = False,
                 step_mode: str = "s", store_v_seq: bool = False, backend: str | None = None,
                 options: Mapping[str, bool] | None = None, initial: Mapping[str, float | str] | None = None,
                 recompute: bool = False, save_h: bool = True, store_final_states: bool = True, **params: Any):
        nn.Module.__init__(self)  # not MemoryModule's (where it is the base): it sets the dict this class lacks
        for name, given in (("options", options), ("initial", initial)):
            if given is not None and not isinstance(given, Mapping):
                raise TypeError(f"{name}: expected a mapping by name (a dict), got {type(given).__name__}")
        spec = resolve_spec(spec)
        self.spec = spec.with_options(**options) if options else spec
        if step_mode not in ("s", "m"):
            raise ValueError(f"step_mode: expected 's' (single step) or 'm' (multi step), got {step_mode!r}")
        check_backend(backend)
        check_switches(**dict(zip(FLAGS, (detach_reset, store_v_seq, recompute, save_h, store_final_states))))
        # References by string: what torch.compile's Dynamo can pass around as constants (see runtime.configs)
        self._spec_ref = spec_ref(self.spec)
        self.surrogate_function = self.spec.surrogate if surrogate_function is None else surrogate_function
        self._state_names = self._memory_names = tuple(s.name for s in self.spec.states)
        self._input_names = self.spec.inputs
        self._take_output()
        # a spec whose reset detaches the spike (`NeuronSpec.detach_reset`) makes the layer's switch True
        self.detach_reset = bool(detach_reset) or self.spec.detach_reset
        self.step_mode, self.store_v_seq = step_mode, bool(store_v_seq)
        self.recompute, self.save_h, self.store_final_states = recompute, save_h, store_final_states
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
        for name, init in (initial or {}).items():  # a number or tensor, or the name of what each reset reads
            if not isinstance(init, str):
                check_memory(f"initial: state {name!r}", init)
            elif not hasattr(self, init):
                raise ValueError(f"initial: state {name!r} starts at {init!r}, which is neither a parameter nor an "
                                 f"attribute of the layer")
        self.reset()

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "store_v_seq" in state:  # pickled when it was a plain attribute
            state = {**state, "_store_v_seq": state["store_v_seq"]}
            del state["store_v_seq"]
        nn.Module.__setstate__(self, state)
        if "_output_program" not in self.__dict__:
            self._take_output()
        self.__dict__.setdefault("_input_names", self.spec.inputs)
        self.__dict__.setdefault("recompute", False)
        self.__dict__.setdefault("save_h", True)
        self.__dict__.setdefault("store_final_states", True)
        # References name objects registered in the process that built the layer (unpickling: register here); the
        # output-writing variant's (`nn.layer_call.written_spec_ref`) is worked out again at its next use
        self.__dict__.pop("_written_spec", None)
        self._spec_ref = spec_ref(self.spec)
        self._use_surrogate(self.surrogate_function)

    def __setattr__(self, name: str, value: Any) -> None:
        """nn.Module's, except for `surrogate_function`, whose new value the layer's calls take (`_use_surrogate`), and
        `backend`, `step_mode` and the flags (`FLAGS`), checked as at construction."""
        if name == "surrogate_function":
            self._use_surrogate(value)
        elif name == "spec" and "_spec_ref" in self.__dict__:  # after construction: the next call runs it
            self._use_spec(self._replacing_spec(value))
        else:
            if name == "backend":
                check_backend(value)
            elif name == "step_mode" and value not in ("s", "m"):  # as at construction (SpikingJelly's refuses it)
                raise ValueError(f"step_mode: expected 's' (single step) or 'm' (multi step), got {value!r}")
            elif name in FLAGS:
                check_switches(**{name: value})
                if name == "detach_reset" and not value and self.spec.detach_reset:
                    raise ValueError(f"detach_reset: the reset of {self.spec.name!r} detaches the spike (its spec "
                                     "says so: s.detach() in a Python step, detach_reset = true in TOML); a layer "
                                     "cannot attach it")
                if name == "store_final_states" and not value and \
                        type(self).multi_step_forward is not Neuron.multi_step_forward:
                    raise TypeError(f"store_final_states: {type(self).__name__} runs multi-step calls of its own, "
                                    f"which keep their final states")
            elif name in self.__dict__.get("_param_names", ()):  # as at construction (calls would refuse it)
                _check_param(next(p for p in self.spec.params if p.name == name), value)
            nn.Module.__setattr__(self, name, value)

    def register_parameter(self, name: str, param: nn.Parameter | None) -> None:
        self._refuse_state_name(name, "a Parameter")
        nn.Module.register_parameter(self, name, param)

    def register_buffer(self, name: str, tensor: torch.Tensor | None, persistent: bool = True) -> None:
        self._refuse_state_name(name, "a buffer")
        nn.Module.register_buffer(self, name, tensor, persistent)

    def _refuse_state_name(self, name: str, what: str) -> None:
        """A state is replaced by each call (in the instance dict): a Parameter or buffer of its name would be read
        by the first call only, then hidden (SpikingJelly's next call refuses it)."""
        if name in self.__dict__.get("_state_names", ()):
            raise TypeError(f"{type(self).__name__}: {name!r} is a state, which each call replaces; it cannot be "
                            f"{what}: set a tensor or a number (layer.{name} = value), or start it at a parameter's "
                            f"value (initial={{{name!r}: 'parameter name'}})")

    def _use_surrogate(self, source: Any) -> None:
        """Make `source` the layer's surrogate_function: a frozen surrogate (the shared default, a spec's) is
        copied, so that the layer's own can be changed (`set_spiking_mode`, `.alpha = ...`) without changing
        others'. The calls use a frozen copy of its values now (`_surrogate`, `_surrogate_ref`). A change of our
        surrogate object calls `_surrogate_changed` at once (it watches the layer); another kind of object (a
        SpikingJelly surrogate) is compared with the state seen here at each call (`layer_call.sync_surrogate`)."""
        ours = isinstance(source, Surrogate)
        if ours and source.frozen() is source:
            source = source.copy()
        foreign = None if ours else (source, surrogate_state(source))
        chosen = self._surrogate_for(source)
        modules = self.__dict__.get("_modules")
        if modules is not None and "surrogate_function" in modules and not isinstance(source, nn.Module):
            del modules["surrogate_function"]  # a SpikingJelly surrogate (a module) replaced by another kind
        nn.Module.__setattr__(self, "surrogate_function", source)
        d = self.__dict__
        d["_surrogate"], d["_surrogate_ref"], d["_surrogate_foreign"] = chosen, surrogate_ref(chosen), foreign
        if ours:
            source.watch(self)

    def _surrogate_changed(self, source: Surrogate) -> None:
        """Our surrogate `source` changed: take its values, where it is still this layer's surrogate_function."""
        if self.__dict__.get("surrogate_function") is source:
            self._use_surrogate(source)

    def _surrogate_for(self, source: Any) -> Surrogate:
        """The frozen surrogate a call uses for the surrogate_function `source` (layers whose surrogate_function
        selects their spec instead override this)."""
        return get_surrogate(source).frozen()

    def _set_option(self, name: str, value: Any) -> None:
        """Change the spec's compile-time option `name` (an attribute of SpikingJelly's classes, which read it at
        every call: `decay_input`, ...): the next call runs the kernels of the spec with it."""
        value = bool(value)  # SpikingJelly tests the attribute's truth
        if dict(self.spec.options).get(name) == value:
            return
        self._use_spec(self.spec.with_options(**{name: value}))

    def _use_spec(self, spec: NeuronSpec) -> None:
        """Run `spec` from the next call on: the spec, its reference and its output (`_take_output`) change together."""
        self.__dict__["spec"] = spec
        self._spec_ref = spec_ref(spec)
        self._take_output()
        if spec.detach_reset:  # the spec's detachment holds whatever the layer says
            self.detach_reset = True

    def _replacing_spec(self, value: Any) -> NeuronSpec:
        """`value` as the layer's new spec: one of the same inputs, states and parameters (what the layer holds and
        reads by name), else refused naming what differs."""
        spec = resolve_spec(value)
        old = self.spec
        for what, of in (("inputs", lambda s: tuple(s.inputs)), ("states", lambda s: tuple(x.name for x in s.states)),
                         ("parameters", lambda s: tuple(p.name for p in s.params))):
            if of(spec) != of(old):
                raise ValueError(f"spec: a layer's {what} are fixed at construction ({', '.join(of(old))}), the new "
                                 f"spec's are {', '.join(of(spec)) or 'none'}: build a new layer for it")
        return spec

    @property
    def store_v_seq(self) -> bool:
        """Whether a call keeps the membrane's sequence in `v_seq`; setting it drops the kept one (as SpikingJelly)."""
        return self.__dict__["_store_v_seq"]

    @store_v_seq.setter
    def store_v_seq(self, value: bool) -> None:
        check_switches(store_v_seq=value)
        self.__dict__["_store_v_seq"] = value
        self.__dict__["v_seq"] = None

    def _set_params(self, params: Mapping[str, Any]) -> None:
        unknown = [n for n in params if n not in self._param_names]
        if unknown:
            raise TypeError(f"unknown parameter {unknown[0]!r} for neuron {self.spec.name!r} "
                            f"(parameters: {', '.join(self._param_names)})")
        for p in self.spec.params:
            value = params.get(p.name, _UNSET)
            if value is _UNSET:
                value = nn.Parameter(torch.tensor(p.default)) if p.learnable else p.default
            else:
                _check_param(p, value)
                if isinstance(value, (int, float)):
                    p.check(value, self.spec.name)
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
        # Stores as `store_states` does, inline, with `is_compiling` asked once
        compiling = torch.compiler.is_compiling()
        d = self.__dict__
        for name, init in d["_initial"].items():  # by state, in order
            value = initial_value(self, init)
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
        detach_memories(d, d["_memory_names"])
        if isinstance(d.get("v_seq"), torch.Tensor):  # a new tensor, as SpikingJelly's
            d["v_seq"] = d["v_seq"].detach()

    # -- SpikingJelly's memory protocol ----------------------------------------------------------------
    def register_memory(self, name: str, value: Any) -> None:
        """Add a memory that `reset()` restores to `value` (SpikingJelly's `MemoryModule.register_memory`)."""
        if not isinstance(name, str) or not name.isidentifier() or hasattr(self, name):
            raise ValueError(f"register_memory: {name!r} is not a free attribute name of {type(self).__name__}")
        self._memory_names = (*self._memory_names, name)
        self.set_reset_value(name, value)
        self.__dict__[name] = initial_value(self, self._initial[name])

    def set_reset_value(self, name: str, value: Any) -> None:
        """The value `reset()` gives the memory `name` from now on (a copy of `value`)."""
        if name not in self._memory_names:
            raise KeyError(f"set_reset_value: {name!r} is not a memory of this layer "
                           f"(memories: {', '.join(self._memory_names)})")
        if name in self._state_names:  # a registered memory may hold anything, as SpikingJelly's
            check_memory(name, value)
        self._initial[name] = value.detach().clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)

    def get_reset_value(self, name: str) -> Any:
        """The value `reset()` gives the memory `name` (a parameter's current value where the spec names one)."""
        if name not in self._memory_names:
            raise KeyError(f"get_reset_value: {name!r} is not a memory of this layer "
                           f"(memories: {', '.join(self._memory_names)})")
        return initial_value(self, self._initial[name])

    def named_memories(self) -> Iterator[tuple[str, Any]]:
        """(name, value) of every state, in the spec's order (the membrane first), then registered memories."""
        for name in self._memory_names:
            yield name, getattr(self, name)

    def materialize_states(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...],
                           step_mode: str) -> tuple[Any, ...]:
        """The states a call on `inputs` starts from: numbers kept, tensors of another neuron shape restarted
        at their initial values, others cast to the input's dtype."""
        n = len(self._state_names)
        if not isinstance(states, (tuple, list)):
            raise TypeError(f"states: expected a tuple of the memories ({', '.join(self._memory_names)}), got "
                            f"{type(states).__name__}")
        if len(states) != len(self._memory_names):
            raise ValueError(f"states: expected {len(self._memory_names)} ({', '.join(self._memory_names)}), "
                             f"got {len(states)}")
        first = 1 if step_mode == "m" else 0
        fitted = start_states(self, inputs[0], first, torch.compiler.is_compiling(), states[:n])
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
        states = self.materialize_states(inputs, states, self.step_mode)
        if self.step_mode == "m":
            return self.multi_step_functional_forward(inputs, states, **kwargs)
        return self.single_step_functional_forward(inputs, states, **kwargs)

    def _functional(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...], *, multi: bool
                    ) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
        if not isinstance(inputs, (tuple, list)):
            raise TypeError(f"inputs: expected a tuple holding the input tensor(s), got {type(inputs).__name__}")
        sync_surrogate(self)
        given, x = step_inputs(self, tuple(inputs), 2 if multi else 0)
        n = len(self._state_names)
        compiling = torch.compiler.is_compiling()
        params = read_params(self, compiling)
        run: Callable[..., Any] = F.multi_step if multi else F.single_step
        extra = {"store_state_seq": self._output_reads_states, "recompute": self.recompute,
                 "save_h": self.save_h} if multi else {}
        out = run(self._spec_ref, given, *states[:n], surrogate=self._surrogate_ref,
                  detach_reset=self.detach_reset, backend=BACKENDS[self.backend], **extra, **params)
        after = out[2] if multi else out[1]  # the state sequences, or the new states
        return (call_output(self, given, out[0], after, params),), (*out[1], *states[n:])

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Module.to() and friends move tensor states with the parameters (as SpikingJelly's memories), and v_seq with
        them: single steps go on appending to it."""
        d = self.__dict__
        for name in (*d["_memory_names"], "v_seq"):
            if isinstance(d.get(name), torch.Tensor):
                d[name] = fn(d[name])
        return nn.Module._apply(self, fn, *args, **kwargs)  # not MemoryModule's (where it is the base)

    def _take_output(self) -> None:
        """The layer's output for its spec (`nn.output`: the spike unless the spec names another), its program and
        whether it reads a state, worked out here, where the layer is built or its spec changes: never in a call,
        which torch.compile may trace."""
        d, spec = self.__dict__, self.spec
        output = d["_output"] = spec_output(spec)
        program = d["_output_program"] = output_program(spec, output)
        d["_output_reads_states"] = reads_states(spec, output, program)

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
        sync_surrogate(self)
        compiling = torch.compiler.is_compiling()  # asked once a call (see `store_states`)
        if not compiling and len(inputs) == 1:
            spike = run_keyed(self, inputs[0], 0)
            if spike is not None:
                return spike
        given, x = step_inputs(self, inputs, 0)
        params = read_params(self, compiling)
        spike, new_states = run_step(self, given, start_states(self, x, 0, compiling), params, compiling)
        store_states(self, self._state_names, new_states, compiling)
        if self.store_v_seq:  # SpikingJelly's single steps append the membrane to v_seq until a reset
            append_v_seq(self, new_states[0], compiling)
        return call_output(self, given, spike, new_states, params)

    def multi_step_forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        compiling = torch.compiler.is_compiling()  # asked once a call (see `store_states`)
        if self.__dict__["_surrogate_foreign"] is not None:  # `sync_surrogate`, its test inline (the hot path)
            sync_surrogate(self)
        if not compiling and len(inputs) == 1:
            spikes = run_keyed(self, inputs[0], 1)
            if spikes is not None:
                return spikes
        given, x_seq = step_inputs(self, inputs, 1)
        if x_seq.dim() == 1:
            return self._one_neuron(inputs, compiling)
        params = read_params(self, compiling)
        states = start_states(self, x_seq, 1, compiling)
        written = writes_output(self, x_seq, states, params, compiling)
        spikes, finals, seqs = run_sequence(self, given, states, params, compiling, written)
        if finals is not None:  # unless `store_final_states` is False
            store_states(self, self._state_names, finals, compiling)
        if seqs is not None and self.store_v_seq:
            store_states(self, ("v_seq",), seqs[:1], compiling)
        return spikes if written else call_output(self, given, spikes, seqs, params)

    def _one_neuron(self, inputs: tuple[torch.Tensor, ...], compiling: bool) -> torch.Tensor:
        """Step mode 'm' on x_seq of shape [T]: one neuron, as SpikingJelly takes it (its states of shape [],
        v_seq of shape [T]); the kernels run it as [T, 1]."""
        d = self.__dict__
        names = d["_state_names"]
        states = [d.get(name) for name in names]
        store_states(self, names, [v.reshape(1) if isinstance(v, torch.Tensor) and v.dim() == 0 else v
                                   for v in states], compiling)
        out = self.multi_step_forward(*(x.unsqueeze(1) for x in inputs))
        for name in (*names, "v_seq"):
            value = d.get(name) if not compiling else getattr(self, name, None)
            if isinstance(value, torch.Tensor) and value.shape[-1:] == (1,):
                # a state as a tensor of its own (one value copied), not a view: `detach()` cuts it in place
                one = value.squeeze(-1) if name == "v_seq" else value.squeeze(-1).clone()
                store_states(self, (name,), (one,), compiling)
        return out.squeeze(1)

    def extra_repr(self) -> str:
        params = []
        for name in self._param_names:
            value = getattr(self, name)
            if isinstance(value, torch.Tensor):
                kind = "Parameter" if isinstance(value, nn.Parameter) else "tensor"
                # its value read detached: a learned one's float() warns about its gradient
                value = f"{kind}{list(value.shape)}" if value.numel() != 1 else f"{kind}({float(value.detach()):.4g})"
            params.append(f"{name}={value}")
        options = [f"{n}={v}" for n, v in self.spec.options]
        return ", ".join([f"spec={self.spec.name!r}", *params, *options, f"surrogate={self._surrogate!r}",
                          f"detach_reset={self.detach_reset}", f"step_mode={self.step_mode!r}",
                          f"store_v_seq={self.store_v_seq}", f"backend={self.backend!r}",
                          *(["recompute=True"] if self.recompute else []), *([] if self.save_h else ["save_h=False"]),
                          *([] if self.store_final_states else ["store_final_states=False"])])


def option_attribute(name: str) -> property:
    """A layer attribute that is the spec's compile-time option `name` (SpikingJelly's `decay_input`, ...):
    reading gives the option, setting it changes the layer's spec (`Neuron._set_option`)."""
    def get(self: Neuron) -> bool:
        return dict(self.spec.options)[name]

    def set_(self: Neuron, value: Any) -> None:
        self._set_option(name, value)

    return property(get, set_, doc=f"The spec's option {name!r}; the next call runs the kernels of its new value.")
