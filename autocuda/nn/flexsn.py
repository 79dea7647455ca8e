"""`FlexSN`: a neuron written as one Python step function, SpikingJelly 2.0's `FlexSN` interface on our kernels.

`core(*step_inputs, *states, *static_inputs)` returns `(*outputs, *new_states)`. At construction the core is
traced (`autocuda.spec.trace`) into a NeuronSpec (`autocuda.spec.python`): the same spec a TOML file gives, so
the generated kernels (forward, derived backward, every dtype), the reference and the host runner all apply. Its
outputs are the spike, new states (read from the state sequences) or other elementwise expressions of (the
inputs, the states before the step, the static inputs, the spike), which are computed with torch after the
kernel and are differentiable through autograd. A core with several step inputs gives a spec with several
`inputs`: the kernels read each (one tensor per input, of one shape) and return a gradient for each. The
mapping of a trace onto a spec (sympy) is kept in the disk cache under the trace's text: a warm process traces
the core (cheap, no sympy) and reads the spec.

Static inputs are registered as SpikingJelly does (`_static_input_<i>`: an nn.Parameter is learned, any other
tensor is a buffer), one value or one per neuron. `backend`: None (the kernels for CUDA tensors, the reference
on CPU), 'cuda', 'host' (the generated CUDA on the CPU), 'reference' (the traced spec evaluated with torch), or
'eager' (the core itself, step by step, for debugging).
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch
from torch import nn

from ..base.errors import SpecError
from ..base.switches import check_switches
from ..call import functional as F
from ..runtime.configs import spec_ref, surrogate_ref
from ..spec import flat
from ..spec.model import Param
from ..spec.reads import reads_key
from ..spec.step import EXPRESSION, SPIKE, STATE, StepSpec, prepare
from ..spec.trace import signature_names
from ..toolchain import store
from .arguments import fixed_at_construction, refuse_proxy
from .memory import Memories, MemoryBase

__all__ = ["FlexSN", "flexsn_spec"]

_BACKENDS = {None: None, "auto": None, "torch": "reference", "reference": "reference", "cuda": "cuda",
             "host": "host", "eager": "eager"}
KIND = "specs"  # the disk cache's folder of spec entries: traced steps beside the parse marks


def _static_params(names: Sequence[str], static_inputs: Sequence[torch.Tensor]) -> tuple[Param, ...]:
    """The static inputs as tensor parameters. Their values are always passed, so the spec's defaults are one
    number for all: layers whose static inputs start at other values share one spec, derivation and plan."""
    return tuple(Param(name, 1.0, kind="tensor", learnable=isinstance(tensor, nn.Parameter))
                 for name, tensor in zip(names, static_inputs))


@functools.lru_cache(maxsize=256)
def _traced(core: Callable[..., Any], reads: Hashable, num_states: int, static: tuple[tuple[str, float, bool], ...]
            ) -> StepSpec:
    """`_trace_step`, kept per core and per value of what it reads (`reads`, `spec.reads.reads_key`)."""
    return _trace_step(core, num_states, static)


def _trace_step(core: Callable[..., Any], num_states: int, static: tuple[tuple[str, float, bool], ...]) -> StepSpec:
    """The core's StepSpec. The trace runs every time (it is the key); its mapping onto a spec, which needs
    sympy, is kept on disk under the trace's text, so a process that finds it there never imports sympy."""
    names = [p.name for p in signature_names(core)]
    num_inputs = len(names) - num_states - len(static)
    params = tuple(Param(n, d, kind="tensor", learnable=lrn) for n, d, lrn in static)
    inner = getattr(core, "__code__", None)
    origin = f"{inner.co_filename}:{inner.co_firstlineno}" if inner is not None else "<python>"
    doc = (getattr(core, "__doc__", None) or "").strip().split("\n")[0]
    traced, inputs, states, spec_params = prepare(core, names[num_inputs:num_inputs + num_states], params,
                                                  num_inputs=num_inputs, origin=origin)
    key = store.key("flexsn step " + repr((traced.text(), states, [dataclasses.astuple(p) for p in spec_params],
                                           doc, origin)))
    cached = store.read(KIND, key)
    if cached is not None:
        try:
            return StepSpec.from_json(cached.decode())
        except (ValueError, KeyError, TypeError, SpecError):
            pass  # an entry this version cannot read: map the trace again
    from ..spec.python import from_trace  # sympy

    step = from_trace(traced, inputs, states, spec_params, doc=doc, origin=origin)
    store.save(KIND, key, step.to_json().encode())
    return step


def flexsn_spec(core: Callable[..., Any], num_states: int, static_inputs: Sequence[torch.Tensor] = ()) -> StepSpec:
    """The traced spec of a FlexSN core: kept per core object, static-input signature and value of everything the
    core reads (`spec.reads`: globals, closure cells, defaults, the functions it calls); traced again when one
    of those changed, or each time where one cannot be compared safely."""
    if not callable(core):
        raise TypeError("core: expected a callable step function")
    if isinstance(num_states, bool) or not isinstance(num_states, int) or num_states < 0:
        raise ValueError(f"num_states: expected a non-negative integer, got {num_states!r}")
    names = [p.name for p in signature_names(core)]
    num_inputs = len(names) - num_states - len(static_inputs)
    if num_inputs < 1:
        raise ValueError(f"core: {len(names)} positional arguments leave no step input before {num_states} "
                         f"state(s) and {len(static_inputs)} static input(s)")
    params = _static_params(names[num_inputs + num_states:], static_inputs)
    static = tuple((p.name, p.default, p.learnable) for p in params)
    reads = reads_key(core)
    return _trace_step(core, num_states, static) if reads is None else _traced(core, reads, num_states, static)


def _output_names(step: StepSpec) -> tuple[str, ...]:
    """The names an output's expression may read: the inputs, the states, the parameters, s."""
    return (*step.spec.inputs, *(s.name for s in step.spec.states), *(p.name for p in step.spec.params), "s")


@functools.lru_cache(maxsize=256)
def _output_program(step: StepSpec, text: str) -> flat.Program:
    """An output's expression as a flat program (`spec.flat`): read from the disk cache (checked: `flat.check`),
    else parsed and lowered with sympy and stored, so that a later process evaluates it without sympy."""
    names = _output_names(step)
    key = store.key("flexsn output program " + repr((names, text)))
    cached = store.read(KIND, key)
    if cached is not None:
        try:
            return flat.from_json(cached, names)
        except ValueError:
            pass  # an entry this version did not write: lower the expression again
    import sympy

    from ..spec.parse import parse_expression
    from ..spec.torch_eval import lower

    symbols = {n: sympy.Symbol(n, real=True) for n in names}
    program = lower(parse_expression(text, symbols, source=step.spec.origin, field="outputs"))
    store.save(KIND, key, flat.to_json(program))
    return program


class FlexSN(Memories, MemoryBase):
    """A neuron from a step function: `FlexSN(core, num_states, static_inputs=(), step_mode='m',
    store_state_seqs=False, backend=None)` (see the module doc).

    SpikingJelly's memory protocol, as its FlexSN's: the states are the memories `_state_0`, `_state_1`, ...
    (None until the first call), `reset()` restores them, `detach()` cuts their graphs in place
    (`functional.detach_net`), `Module.to` converts them; where SpikingJelly is installed this is a subclass of
    its `base.MemoryModule` (`extract_memories`, ... see the layer). Its functional protocol as SpikingJelly's
    FlexSN's: `init_states`, `materialize_states`, `functional_forward` and `single_step_functional_forward` /
    `multi_step_functional_forward(inputs, states, static_inputs=...)` (static_inputs: the layer's by default),
    which return `(outputs, new_states)` without touching the layer's states."""

    def __init__(self, core: Callable[..., Any], num_states: int, static_inputs: Sequence[torch.Tensor] = (),
                 step_mode: str = "m", store_state_seqs: bool = False, *, backend: str | None = None):
        nn.Module.__init__(self)  # not MemoryModule's (where it is the base): it sets the dict this class lacks
        if isinstance(core, nn.Module):
            raise TypeError("core: a FlexSN core is a plain function; pass tensors through static_inputs")
        static_inputs = tuple(static_inputs)
        for i, tensor in enumerate(static_inputs):
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"static_inputs[{i}]: expected a tensor, got {type(tensor).__name__}")
        self.backend = backend
        self.step = flexsn_spec(core, num_states, static_inputs)
        self.__dict__["_core"], self.__dict__["_num_states"] = core, num_states
        self._state_names = tuple(f"_state_{i}" for i in range(num_states))
        self._static_input_names = tuple(f"_static_input_{i}" for i in range(len(static_inputs)))
        for name, tensor in zip(self._static_input_names, static_inputs):
            if isinstance(tensor, nn.Parameter):
                self.register_parameter(name, tensor)
            else:
                self.register_buffer(name, tensor)
        self._refs()
        self.step_mode = step_mode
        self.store_state_seqs = store_state_seqs
        self._start_memories(dict.fromkeys(self._state_names))

    def _refs(self) -> None:
        self._spec_ref = spec_ref(self.step.spec)
        self._surrogate_ref = surrogate_ref(self.step.spec.surrogate)
        # each output's flat program (None: the spike or a state), made here and not in a call: torch.compile
        # cannot trace the disk cache that `_output_program` reads
        self._output_programs = tuple(_output_program(self.step, o.expr) if o.kind == EXPRESSION else None
                                      for o in self.step.outputs)

    core = fixed_at_construction("core", "its step was traced from it")
    num_states = fixed_at_construction("num_states", "its step was traced with that many states")

    @property
    def num_inputs(self) -> int:
        """The step inputs a call takes: the core's arguments before its states (fixed by the trace)."""
        return self.step.num_inputs

    @num_inputs.setter
    def num_inputs(self, value: Any) -> None:
        raise AttributeError(f"FlexSN.num_inputs is fixed at construction ({self.num_inputs!r}): it is the core's "
                             f"arguments before its states; build a new layer for num_inputs={value!r}")

    @property
    def num_outputs(self) -> int:
        """The outputs a call returns: what the core returns before its new states (fixed by the trace)."""
        return len(self.step.outputs)

    @num_outputs.setter
    def num_outputs(self, value: Any) -> None:
        raise AttributeError(f"FlexSN.num_outputs is fixed at construction ({self.num_outputs!r}): it is what the "
                             f"core returns before its new states; build a new layer for num_outputs={value!r}")

    @property
    def backend(self) -> str | None:
        """Where calls run (`_BACKENDS`; "eager" calls the core itself), read at every call; checked when set."""
        return self.__dict__["_backend"]

    @backend.setter
    def backend(self, value: str | None) -> None:
        if not isinstance(value, (str, type(None))) or value not in _BACKENDS:
            raise ValueError(f"backend: expected one of {[b for b in _BACKENDS if b]} or None, got {value!r}")
        self.__dict__["_backend"] = value

    def __setstate__(self, state: dict[str, Any]) -> None:
        # pickled when these were plain attributes
        state = {("_" + k if k in ("core", "num_states", "backend") else k): v for k, v in state.items()}
        if "_state_names" not in state:  # pickled when the states were one list
            names = tuple(f"_state_{i}" for i in range(state["_num_states"]))
            state = {**state, **dict(zip(names, state.pop("_states", ()))), "_state_names": names,
                     "_memory_names": names, "_reset_values": dict.fromkeys(names)}
        nn.Module.__setstate__(self, state)
        self._refs()  # references name objects registered in this process

    @property
    def spec(self) -> Any:
        """The NeuronSpec the core traced to (`self.spec.source('fptt')` shows its kernel)."""
        return self.step.spec

    @property
    def static_inputs(self) -> tuple[torch.Tensor, ...]:
        return tuple(getattr(self, n) for n in self._static_input_names)

    @property
    def _states(self) -> list[torch.Tensor | None]:
        """The states, in the order of the core's arguments (the memories `_state_<i>`)."""
        d = self.__dict__
        return [d.get(name) for name in d["_state_names"]]

    @_states.setter
    def _states(self, values: Sequence[torch.Tensor | None]) -> None:
        d = self.__dict__
        for name, value in zip(d["_state_names"], values, strict=True):
            d[name] = value

    @property
    def states(self) -> tuple[torch.Tensor | None, ...]:
        return tuple(self._states)

    @states.setter
    def states(self, values: Sequence[torch.Tensor]) -> None:
        values = tuple(values)
        if len(values) != self.num_states:
            raise ValueError(f"states: expected {self.num_states} tensors, got {len(values)}")
        if not all(isinstance(v, torch.Tensor) for v in values):
            raise TypeError("states: expected tensors")
        self._states = list(values)

    def _step_mode_set(self) -> None:
        self.state_seqs: tuple[torch.Tensor, ...] | None = None

    @property
    def store_state_seqs(self) -> bool:
        return self._store_state_seqs

    @store_state_seqs.setter
    def store_state_seqs(self, value: bool) -> None:
        check_switches(store_state_seqs=value)  # a word such as "no" is true
        self._store_state_seqs = value
        self.state_seqs = None

    def reset(self) -> None:
        """Forget the states (the next call starts from zeros) and the stored state sequences."""
        Memories.reset(self)
        self.state_seqs = None

    # -- forward ----------------------------------------------------------------------------------
    def forward(self, *inputs: torch.Tensor) -> Any:
        outputs = self._call(inputs, self.step_mode == "m", self.static_inputs)
        return outputs[0] if len(outputs) == 1 else outputs

    def _call(self, inputs: tuple[torch.Tensor, ...], multi: bool, statics: tuple[torch.Tensor, ...]
              ) -> tuple[torch.Tensor, ...]:
        """A call from the layer's states (which keep the new ones), with the static inputs `statics`."""
        count = self.step.num_inputs
        if len(inputs) != count:
            raise ValueError(f"FlexSN takes {count} step input{'s' if count > 1 else ''}, got {len(inputs)}")
        for i, value in enumerate(inputs):
            if not isinstance(value, torch.Tensor):
                refuse_proxy(self, value)
                raise TypeError(f"input {i}: expected a tensor, got {type(value).__name__}")
        if multi and (inputs[0].dim() < 1 or inputs[0].shape[0] == 0):  # every backend, "eager" too
            raise ValueError(f"input: step_mode 'm' expects [T, *] with T >= 1, got {tuple(inputs[0].shape)}")
        if self.backend == "eager":
            return self._eager(inputs, multi, statics)
        if multi:
            return self._one_neuron(inputs, statics) if inputs[0].dim() == 1 else self._multi(inputs, statics)
        return self._single(inputs, statics)

    # -- SpikingJelly's functional protocol (`base.MemoryModule`, its FlexSN's) ---------------------------------
    @staticmethod
    def init_states(num_states: int, step_mode: str, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """`num_states` zero states of one step of the first input (SpikingJelly's FlexSN.init_states)."""
        if not inputs:
            raise ValueError("FlexSN.init_states: expected at least one input tensor")
        reference = inputs[0]
        if step_mode == "m":
            if reference.dim() < 1 or reference.shape[0] == 0:
                raise ValueError(f"input: step_mode 'm' expects [T, *] with T >= 1, got {tuple(reference.shape)}")
            reference = reference[0]
        return tuple(torch.zeros_like(reference) for _ in range(num_states))

    def materialize_states(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...],
                           step_mode: str) -> tuple[Any, ...]:
        """`states` with zeros where SpikingJelly's FlexSN starts from zeros (a None state)."""
        states = tuple(states)
        if len(states) != self.num_states:
            raise ValueError(f"states: expected {self.num_states} tensors, got {len(states)}")
        if any(state is None for state in states):
            zeros = self.init_states(self.num_states, step_mode, *inputs)
            return tuple(zero if state is None else state for state, zero in zip(states, zeros))
        return states

    def functional_forward(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...],
                           **kwargs: Any) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
        """A call in the layer's step mode from explicit `states`; the layer's own states are not touched."""
        inputs = tuple(inputs)
        states = self.materialize_states(inputs, tuple(states), self.step_mode)
        if self.step_mode == "m":
            return self.multi_step_functional_forward(inputs, states, **kwargs)
        return self.single_step_functional_forward(inputs, states, **kwargs)

    def single_step_functional_forward(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...], *,
                                       static_inputs: Sequence[torch.Tensor] | None = None, **kwargs: Any
                                       ) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
        """One step from explicit `states` (None: zeros) and `static_inputs` (None: the layer's): returns
        `(outputs, new_states)`, as SpikingJelly's; the layer's own states are not touched."""
        return self._functional(inputs, states, static_inputs, multi=False)

    def multi_step_functional_forward(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...], *,
                                      static_inputs: Sequence[torch.Tensor] | None = None, **kwargs: Any
                                      ) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
        """A sequence from explicit states, as `single_step_functional_forward`."""
        return self._functional(inputs, states, static_inputs, multi=True)

    def _functional(self, inputs: Sequence[torch.Tensor], states: Sequence[Any],
                    static_inputs: Sequence[torch.Tensor] | None, multi: bool
                    ) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
        states = tuple(states)
        if len(states) != self.num_states:
            raise ValueError(f"states: expected {self.num_states} tensors, got {len(states)}")
        statics = self.static_inputs if static_inputs is None else tuple(static_inputs)
        if len(statics) != len(self._static_input_names):
            raise ValueError(f"static_inputs: expected {len(self._static_input_names)} tensors, got {len(statics)}")
        for i, tensor in enumerate(statics):
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"static_inputs[{i}]: expected a tensor, got {type(tensor).__name__}")
        kept, kept_seqs = self._states, self.state_seqs
        self._states = list(states)
        try:
            outputs = self._call(tuple(inputs), multi, statics)
            return outputs, tuple(self._states)
        finally:
            self._states, self.state_seqs = kept, kept_seqs

    def _params(self, shape: tuple[int, ...], statics: tuple[torch.Tensor, ...]) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name, tensor in zip(self.step.params, statics):
            if tensor.numel() != 1 and tensor.numel() != _numel(shape):
                raise ValueError(f"static input {name!r}: {tensor.numel()} values, expected 1 or one per neuron "
                                 f"({_numel(shape)})")
            values[name] = tensor.reshape(()) if tensor.numel() == 1 else tensor.reshape(shape)
        return values

    def _initial(self) -> list[torch.Tensor | float]:
        """Initial states in the spec's order (a missing one starts at 0, as SpikingJelly's zeros)."""
        given = {n: v for n, v in zip(self.step.states, self._states) if v is not None}
        return [given.get(s.name, 0.0) for s in self.step.spec.states]

    def _one_neuron(self, inputs: tuple[torch.Tensor, ...], statics: tuple[torch.Tensor, ...]
                    ) -> tuple[torch.Tensor, ...]:
        """A multi-step call on [T] inputs (one neuron, as SpikingJelly's FlexSN takes them, and as a single step
        takes a 0-d input): run as [T, 1]; outputs and state sequences [T], states 0-d, as the core gives them."""
        kept = self._states
        self._states = [s.reshape(1) if isinstance(s, torch.Tensor) and s.numel() == 1 else s for s in kept]
        try:
            outputs = self._multi(tuple(v.unsqueeze(1) if v.dim() == 1 else v for v in inputs), statics)
        except BaseException:
            self._states = kept
            raise
        self._states = [s.reshape(()) if isinstance(s, torch.Tensor) else s for s in self._states]
        if self.state_seqs is not None:
            self.state_seqs = tuple(q.squeeze(1) for q in self.state_seqs)
        return tuple(o.squeeze(1) for o in outputs)

    def _multi(self, inputs: tuple[torch.Tensor, ...], statics: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        x_seq = inputs[0]
        kinds = {o.kind for o in self.step.outputs}
        seqs_needed = self._store_state_seqs or bool(kinds & {STATE, EXPRESSION})
        params = self._params(tuple(x_seq.shape[1:]), statics)
        initial = self._initial()
        given = inputs if len(inputs) > 1 else x_seq
        spikes, finals, seqs = F.multi_step(self._spec_ref, given, *initial, surrogate=self._surrogate_ref,
                                            detach_reset=self.step.detach_reset, store_state_seq=seqs_needed,
                                            backend=_BACKENDS[self.backend], **params)
        order = [s.name for s in self.step.spec.states]
        by_name = dict(zip(order, seqs)) if seqs is not None else {}
        assert finals is not None
        self._states = [finals[order.index(n)] for n in self.step.states]
        if self._store_state_seqs:
            self.state_seqs = tuple(by_name[n] for n in self.step.states)
        before = {}
        if EXPRESSION in kinds:
            for name, start in zip(order, initial):
                first = torch.as_tensor(start, dtype=x_seq.dtype, device=x_seq.device).expand(x_seq.shape[1:])
                before[name] = torch.cat([first.unsqueeze(0), by_name[name][:-1]])
        return self._outputs(inputs, spikes, by_name, before, params)

    def _single(self, inputs: tuple[torch.Tensor, ...], statics: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        x = inputs[0]
        params = self._params(tuple(x.shape), statics)
        initial = self._initial()
        given = inputs if len(inputs) > 1 else x
        spike, new = F.single_step(self._spec_ref, given, *initial, surrogate=self._surrogate_ref,
                                   detach_reset=self.step.detach_reset, backend=_BACKENDS[self.backend], **params)
        order = [s.name for s in self.step.spec.states]
        after = dict(zip(order, new))
        self._states = [after[n] for n in self.step.states]
        self.state_seqs = None
        before = {n: torch.as_tensor(v, dtype=x.dtype, device=x.device).expand(x.shape)
                  for n, v in zip(order, initial)}
        return self._outputs(inputs, spike, after, before, params)

    def _outputs(self, inputs: tuple[torch.Tensor, ...], spike: torch.Tensor, after: dict[str, torch.Tensor],
                 before: dict[str, torch.Tensor], params: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        x = inputs[0]
        results = []
        for output, program in zip(self.step.outputs, self._output_programs):
            if output.kind == SPIKE:
                results.append(spike)
            elif output.kind == STATE:
                results.append(after[output.state])
            else:
                assert program is not None
                values = {**dict(zip(self.step.spec.inputs, inputs)), "s": spike, **before, **params}
                results.append(flat.run(program, values).to(x.dtype).expand(x.shape))
        return tuple(results)

    def _eager(self, inputs: Sequence[torch.Tensor], multi: bool, statics: tuple[torch.Tensor, ...]
               ) -> tuple[torch.Tensor, ...]:
        """The core itself, step by step (for debugging: no kernel, no trace)."""
        x = inputs[0]
        states: list[torch.Tensor] = [torch.zeros_like(x[0] if multi else x) if s is None else s
                                      for s in self._states]
        # the static inputs as the kernels read them: one value, or one per neuron in the neuron's shape
        values = tuple(self._params(tuple(x.shape[1:] if multi else x.shape), statics).values())
        steps = zip(*(v.unbind(0) for v in inputs)) if multi else (tuple(inputs),)
        per_step: list[tuple[torch.Tensor, ...]] = []
        seqs: list[list[torch.Tensor]] = [[] for _ in states]
        for xt in steps:
            returned = self.core(*xt, *states, *values)
            returned = (returned,) if isinstance(returned, torch.Tensor) else tuple(returned)
            count = len(returned) - self.num_states
            per_step.append(returned[:count])
            states = list(returned[count:])
            for seq, value in zip(seqs, states):
                seq.append(value)
        self._states = list(states)
        self.state_seqs = tuple(torch.stack(s) for s in seqs) if multi and self._store_state_seqs else None
        if not multi:
            return per_step[0]
        return tuple(torch.stack(values) for values in zip(*per_step))

    def extra_repr(self) -> str:
        name = getattr(self.core, "__name__", type(self.core).__name__)
        if isinstance(self.core, functools.partial):  # as SpikingJelly's: partial(<the function's name>)
            name = f"partial({getattr(self.core.func, '__name__', type(self.core.func).__name__)})"
        return (f"core={name}, num_states={self.num_states}, num_static_inputs={len(self._static_input_names)}, "
                f"step_mode={self.step_mode!r}, backend={self.backend!r}")


def _numel(shape: Sequence[int]) -> int:
    count = 1
    for n in shape:
        count *= n
    return count
