"""Programs: what runs a neuron call. One `Program` per (layer configuration, input class), built on the first call
of its key and kept by its owner (a layer's `Programs`, or `PROGRAMS` for functional calls), as CuPy's
`ElementwiseKernel` keeps its memos, tinygrad's `CUDAProgram` its argument layout and Brian2's owners their
`CodeObject`s. A program holds what its configuration decides, checked once, the forward launch bound to its input
class, the backward launches bound at its first backward, and a native plan where the native operator is loaded:
such a call runs no Python between torch and its launches. `call_key` alone decides what may differ between two
calls of one program; `Call` is one call's arguments checked against its program (`Call.launch`).
"""
from __future__ import annotations

import functools
import itertools
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..codegen.broadcast import PER_CHANNEL, PER_NEURON, SHARED, Broadcast
from ..codegen.noise import Seed
from ..runtime.configs import (
    compute_dtype,
    config,
    config_for,
    config_info,
    default_backend,
    spec_facts,
    spec_ref,
    surrogate_ref,
)
from ..spec.domain import checks as domain_checks
from ..spec.domain import problem as domain_problem
from ..spec.load import is_spec_path
from ..toolchain.arrays import dense_problem
from ..toolchain.cnames import DRAW_KEYS
from . import native, ops
from .memory_order import broadcasts
from .native.plan import Unplannable, plan_words

__all__ = ["FLOATS", "Call", "Program", "Programs", "as_rows", "call_key", "configuration_key",
           "configuration_number", "program_key", "state_class"]

Tensor = torch.Tensor
SUPPORTED_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)  # of step inputs
ENABLED = True  # False: programs bind nothing and make no native plan (tests compare the two paths)
# whether a torch.func transform is active (`ops.FUNCTORCH_QUERY`): none on a torch without the query, except for the
# fast paths (`transforms_active`), which then count one as always active
functorch_active: Callable[[], bool] = ops.FUNCTORCH_QUERY or (lambda: False)
transforms_active: Callable[[], bool] = ops.FUNCTORCH_QUERY or (lambda: True)
tracing_state: Callable[[], Any] = torch._C._get_tracing_state  # not None while torch.jit.trace records a call
forward_ad = torch.autograd.forward_ad  # `_current_level` >= 0: forward-mode AD is on, tangents may ride on tensors


# -- the key -------------------------------------------------------------------------------------------------------
def call_key(spec: Any, x: Tensor, states: Sequence[Any], surrogate: Any, detach_reset: bool, reset: str | None,
             backend: str | None, save_h: bool, options: tuple[bool, bool, bool], params: dict[str, Any]) -> tuple:
    """What may differ between two calls that one program runs: the configuration's part (`configuration_key`, as
    its number) and the input class (`program_key`). TypeError for a spec of a wrong type or an unhashable argument."""
    configuration = configuration_number(
        configuration_key(spec, surrogate, detach_reset, reset, backend, save_h, options, params))
    return program_key(configuration, x, state_class(states))


def configuration_key(spec: Any, surrogate: Any, detach_reset: bool, reset: str | None, backend: str | None,
                      save_h: bool, options: tuple[bool, bool, bool], params: dict[str, Any]) -> tuple:
    """The configuration's part of a call's key: the spec and surrogate by reference (`spec_ref`, `surrogate_ref`:
    a name, or a token of the values, a spec file's as it is now), the switches, `options` (single step,
    store_state_seq, final_states), the parameters' names and types, the constants' values and, of tensors, spread,
    need of a gradient and alignment. A function of these objects alone, so a layer keeps it while they are the same
    objects (`nn.layer_call.run_keyed`). By reference, not by id: a key holds no user object, and the id of an
    object freed (a functional call's fresh surrogate, say) may name another one later."""
    if type(spec) is not str or _names_a_file(spec):  # a NeuronSpec, or a file as it is now: edited, another spec
        spec = spec_ref(spec)
    constants = _CONSTANTS.get(spec)
    if constants is None:
        if len(_CONSTANTS) >= Programs.LIMIT:  # references of specs made without end must not grow this
            _CONSTANTS.clear()
        constants = _CONSTANTS[spec] = spec_facts(spec).constant_names
    types = tuple(map(type, params.values()))
    return (spec, surrogate if surrogate is None or type(surrogate) is str else surrogate_ref(surrogate),
            detach_reset, reset, backend, save_h, options, tuple(params), types,
            () if _PLAIN.issuperset(types) else _tensor_facts(params),
            tuple(params.get(n) for n in constants) if constants else ())


def configuration_number(configuration: tuple) -> int:
    """A number for a configuration's part of the key, never reused: a lookup hashes an int, not nested tuples."""
    number = _CONFIGURATIONS.get(configuration)
    if number is None:
        number = next(_NUMBERS)
        if len(_CONFIGURATIONS) >= Programs.LIMIT:  # parts that sweep constants' values must not grow this
            _CONFIGURATIONS.clear()
        _CONFIGURATIONS[configuration] = number
    return number


_CONFIGURATIONS: dict[tuple, int] = {}
_NUMBERS = itertools.count()


def program_key(configuration: int, x: Tensor, state_class: tuple) -> tuple:
    """A call's key: its configuration's number and its input class (x's shape, dtype, device, alignment, contiguity,
    whether it records a graph; the initial states' class)."""
    return (configuration, x.shape, x.dtype, x.device, x.data_ptr() & 15, x.is_contiguous(),
            torch.is_grad_enabled() and x.requires_grad, state_class)


def state_class(states: Sequence[Any]) -> tuple:
    """The initial states' types, and each tensor's alignment and need of a gradient (a bound launch assumes them)."""
    types = tuple(map(type, states))
    if FLOATS.issuperset(types):
        return types
    grad = torch.is_grad_enabled()
    return types, tuple((s.data_ptr() & 15, grad and s.requires_grad) for s in states if isinstance(s, Tensor))


# Each spec's constants' names, by the spec's reference (`spec_ref`)
_CONSTANTS: dict[str, tuple[str, ...]] = {}
# Whether a string names a spec file: asked on every eager call, so cached (a C call, no Python frame)
_names_a_file = functools.lru_cache(maxsize=1024)(is_spec_path)
FLOATS = frozenset({float})  # the types of initial states given as numbers only
_PLAIN = frozenset({float, int, type(None)})  # parameter types that are no tensors (the program checks them)


def _tensor_facts(params: dict[str, Any]) -> tuple:
    """Of each tensor parameter: spread, need of a gradient, alignment (a bound launch assumes its first call's)."""
    grad = torch.is_grad_enabled()
    return tuple((_spread(value), grad and value.requires_grad, value.data_ptr() & 15)
                 if isinstance(value, torch.Tensor) else None for value in params.values())


class Programs(dict):
    """An owner's programs by key (`call_key`), bounded (keys hold shapes and constants' values), and a layer's kept
    configuration (`configured`: `nn.layer_call.run_keyed`). A copied or unpickled owner starts with none.
    `keeps_tensors`: whether its programs may keep a call's tensor parameters (`Program.kept_tensor_args`): a layer's,
    whose tensors the layer holds anyway, not functional calls', which would keep the caller's alive."""

    LIMIT = 1024

    def __init__(self, keeps_tensors: bool = True) -> None:
        super().__init__()
        self.configured: tuple | None = None
        self.keeps_tensors = keeps_tensors

    def find(self, spec: Any, x: Tensor, states: Sequence[Any], surrogate: Any, detach_reset: bool,
             reset: str | None, backend: str | None, save_h: bool, options: tuple[bool, bool, bool],
             params: dict[str, Any]) -> Program:
        """The program of a call, built now where its key is new."""
        try:
            key = call_key(spec, x, states, surrogate, detach_reset, reset, backend, save_h, options, params)
            found = self.get(key)
        except (TypeError, RuntimeError):  # an unhashable argument, a spec of the wrong type, a tensor of no data
            # pointer (sparse, say): the program's checks name it
            return Program(spec, surrogate, detach_reset, reset, backend, x, params, save_h)
        if found is None:
            found = Program(spec, surrogate, detach_reset, reset, backend, x, params, save_h)
            found.configuration = key[0]
            found.tensors_kept = found.tensors_kept and self.keeps_tensors
            if len(self) >= self.LIMIT:
                self.clear()
            self[key] = found
        return found

    def __reduce__(self) -> tuple:
        return Programs, ()


# -- the program ---------------------------------------------------------------------------------------------------
class Program:
    """One layer configuration run on one input class: what the configuration decides, checked once, and for calls
    of one input the bound launches and the native plan."""

    def __init__(self, spec: Any, surrogate: Any, detach_reset: bool, reset: str | None, backend: str | None,
                 x: Tensor, params: dict[str, Any], save_h: bool = True, eager: bool = True):
        ref = spec_ref(spec)  # modules pass references already: nothing here for torch.compile to trace into
        facts = spec_facts(ref)
        self.name, self.param_names, self.constant_names = facts.name, facts.param_names, facts.constant_names
        self.inputs = facts.inputs
        defaults, init_rules = facts.defaults, facts.initial
        # Parameters given as numbers are checked against their domains at every call: (name, comparison, limit)
        self.domains = tuple((n, bounds) for n, bounds in facts.domains
                             if n in params and isinstance(params[n], (int, float)))
        self.domain_checks = tuple((n, holds, limit) for n, bounds in self.domains
                                   for holds, limit in domain_checks(bounds))
        self.backend = default_backend(x.device.type) if backend is None else backend  # ("" is no backend)
        if self.backend not in ("cuda", "host", "reference"):
            raise ValueError(f"backend: expected 'cuda', 'host', 'reference' or None, got {backend!r}")
        if not save_h and facts.draws and self.backend != "reference":
            # (refused here, naming the switch: the derivation's refusal came at the first launch, naming neither)
            raise ValueError(f"save_h=False: neuron {self.name!r} makes random draws in its step, so backward cannot "
                             "replay its charge from x (the replay would not make the draws again), as save_h=False "
                             "and a fused BatchNorm's two-pass backward ask; pass save_h=True (the default)")
        values, reset = self._values(dict(defaults), params, reset)
        constants = tuple((n, as_float(f"parameter {n!r} of {self.name!r}", values.pop(n)))
                          for n in self.constant_names if n in values)
        # v_reset takes no part in a soft reset or none (`runtime_params`): a tensor of it is not read, spreads over
        # no channel and has no gradient
        hard = (reset or facts.reset) == "hard"
        tensors = {n: v for n, v in values.items() if isinstance(v, torch.Tensor) and (hard or n != "v_reset")}
        kinds, self.channel_dim = _kinds({n: _spread(v) for n, v in tensors.items()})
        signature = tuple((n, kinds[n], bool(v.requires_grad) and torch.is_grad_enabled()) for n, v in tensors.items())
        self.tensors_kept = not any(grad for _, _, grad in signature)  # `kept_tensor_args` may keep their list
        self.kept_tensors: tuple | None = None
        self.key = config_for(ref, surrogate_ref(surrogate), reset, bool(detach_reset), constants, signature,
                              self.backend != "reference", not save_h)
        self.state_names, self.tensors, self.scalars, self.reset = config_info(self.key)
        self.bindable = all(kind == SHARED for _, kind in self.tensors)
        # a call's scalars in kernel order (the parameter types are part of the key)
        self.scalar_values = _reader(self.scalars, eager and all(type(values.get(n)) is float for n in self.scalars))
        self.draws = DRAW_KEYS[0] in self.scalars  # each call takes a seed (`spec.draws`, `noise.Seed`)
        # Per call: the defaults not folded into the kernels; the given names whose value is not taken (constants
        # are folded; v_reset=None means a soft reset, its default stays for the initial rule)
        self.defaults = {n: v for n, v in defaults if n not in self.constant_names}
        skipped = set(self.constant_names) | {n for n, v in params.items() if v is None}
        self.skipped = skipped & set(params)
        self.complete = not self.skipped and set(self.defaults) <= set(params)  # no default to fill in
        self.given_tensors = tuple(n for n, v in params.items() if isinstance(v, torch.Tensor))
        self.given_ints = tuple(n for n, v in params.items() if type(v) is int)  # checked to fit a float each call
        # A state left out starts at a number or at a parameter's value (v = v_reset only under a hard reset); a
        # constant's is the number folded into the kernels, which a call's values do not hold
        folded = dict(constants)
        self.inits = {s: (0.0 if init == "v_reset" and self.reset != "hard" else folded.get(init, init))
                      for s, init in init_rules}
        self.launch: Any = None  # the forward launch bound to the input class (`bindable` programs)
        self.backward: tuple | None = None  # the backward launches, bound at the first backward (`bind_backward`)
        self.native: int | None = None  # the native plan, made once the operator is loaded (and backward bound)
        self.native_call: Any = None  # the native operators' `call`, `layer_call`, `layer_call_states` (plan made)
        self.native_layer_call: Any = None
        self.native_layer_states: Any = None
        self.native_wanted = False  # whether calls of this program may take the native path (`bind`)
        self.configuration: int | None = None  # its key's configuration number, where `Programs` keeps it

    def _values(self, values: dict[str, Any], params: dict[str, Any], reset: str | None
                ) -> tuple[dict[str, Any], str | None]:
        unknown = [n for n in params if n not in self.param_names]
        if unknown:
            raise TypeError(f"unknown parameter {unknown[0]!r} for neuron {self.name!r} "
                            f"(parameters: {', '.join(self.param_names)})")
        for name, value in params.items():
            if name == "v_reset" and value is None:  # SpikingJelly's convention: no reset value = soft reset
                reset = "soft" if reset is None else reset
                continue
            if name in self.constant_names and isinstance(value, torch.Tensor):
                raise TypeError(f"parameter {name!r} is a compile-time constant of {self.name!r}: pass a number")
            if not isinstance(value, torch.Tensor) and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise TypeError(f"parameter {name!r}: expected a number or a tensor, got {type(value).__name__}")
            values[name] = value
        return values, reset

    def values(self, params: dict[str, Any], x: Tensor, shape: tuple[int, ...]) -> dict[str, Any]:
        """A call's parameter values by name (defaults filled in), its tensors checked against x and its numbers
        against their domains."""
        for name in self.given_tensors:
            _check_tensor_param(name, params[name], x, shape)
        for name in self.given_ints:
            as_float(f"parameter {name!r} of {self.name!r}", params[name])
        for name, holds, limit in self.domain_checks:
            if not holds(params[name], limit):
                bounds = dict(self.domains)[name]
                raise ValueError(f"parameter {name!r} of {self.name!r} {domain_problem(bounds, params[name])}")
        if self.draws:  # a fresh seed from torch's generator each call; backward gets it with the other scalars
            return {**self.defaults, **{n: v for n, v in params.items() if n not in self.skipped},
                    **Seed.from_torch().arguments()}
        if self.complete:  # `params` is the call's own dict (of `**params`), read only: no copy
            return params
        if not self.skipped:
            return {**self.defaults, **params}
        return {**self.defaults, **{n: v for n, v in params.items() if n not in self.skipped}}

    # -- bound launches and the native plan --------------------------------------------------------------------
    def bind(self, form: ops.ForwardForm, x: Tensor, args: Sequence[Any], n: int, given: Tensor) -> None:
        """Bind the forward launch to a call of the program's input class (x: its rows; `args`: the initial states,
        the tensor parameters, the scalars; `given`: x as given), and say whether its calls may take the native
        path: CUDA calls, or host calls where `native.HOST` asks, of no state sequences."""
        backend = "cuda" if x.is_cuda else "host"
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            return  # not kept: a capture takes the fixed rules' layout where a later call would time one
        launch = form.kernel.bind((x, *args), x, n, None if form.single else x.shape[0], backend)
        self.bound_form, self.neuron_shape = form, given.shape[1:]  # (a multi-step call's: `run_bound`)
        self.native_wanted = (x.is_cuda or (native.HOST and x.is_cpu)) and not form.seqs
        self.launch = launch  # last: another thread that finds it set finds what it reads with it

    def run_bound(self, x: Tensor, states: Sequence[float], params: dict[str, Any]
                  ) -> tuple[list[Tensor], dict[str, Any]] | None:
        """A bound program's call of its key (x contiguous, states numbers): the forward op's outputs and the
        parameters' values; None while the native plan is still to be made (`Call.launch` makes it), or where a state
        starts at a tensor parameter's value (the launch was bound to tensor states: `Call` gives them)."""
        if self.native_wanted and native.USE and self.plannable():
            return None
        shape = self.neuron_shape
        for name in self.state_names[len(states):] if self.given_tensors else ():  # (the key holds params' types)
            init = self.inits[name]
            if isinstance(init, str) and isinstance(params.get(init), Tensor):
                # it starts at a tensor parameter (v = v_reset, a tensor): from a tensor, as `Call` does. Asked before
                # `values`, which takes a spec's seed from torch's generator: `Call` takes the call's one
                return None
        values = self.values(params, x, shape)
        initial = list(map(float, states))
        for name in self.state_names[len(initial):]:
            init = self.inits[name]
            initial.append(float(values[init]) if isinstance(init, str) else init)
        tensors = self.kept_tensor_args(values, x, shape) if self.tensors else ()
        return self.run_numbers(x, [*initial, *self.scalar_values(values)], tensors), values

    def run_layer(self, x: Tensor, states: list[Tensor], numbers: list[float], params: Sequence[Tensor] = ()
                  ) -> list[Tensor]:
        """A layer's keyed call (`nn.layer_call.run_keyed`; `states`: the initial states where tensors, each of the
        neuron shape; `numbers`: where numbers, the initial states, then the scalars; `params`: the tensor parameters,
        one value each, as the layer holds them): the spikes in x's shape and the final states in its neuron shape, by
        the native plan (which refuses tensors unlike its own: dtype, device, size), or a multi-step call's bound
        launch from numbers without tensor parameters; [] where neither runs it (the native plan still to be made;
        tensor states, tensor parameters or a single step on the Python path): the layer's full path runs it."""
        if self.native is not None and native.USE:
            if states or params:
                return self.native_layer_states(self.native, x, [*states, *params], numbers)
            return self.native_layer_call(self.native, x, numbers)
        if states or params or self.launch is None or self.bound_form.single or (
                self.native_wanted and native.USE and self.plannable()):
            return []
        outputs, form = self.run_numbers(x, numbers), self.bound_form
        return [outputs[form.spike_at].view(x.shape), *map(outputs.__getitem__, form.finals)]

    def run_numbers(self, x: Tensor, numbers: list[float], tensors: Sequence[Tensor] = ()) -> list[Tensor]:
        """The forward op's outputs for x of the input class, `numbers` (initial states, then scalars) and the tensor
        parameters as the kernels take them (`tensor_args`): by the native plan where made, else the bound launch."""
        if self.native is not None and native.USE:
            return self.native_call(self.native, x, list(tensors), numbers)
        rows = x if x.dim() == 2 else x.view(x.shape[0], self.launch.n)
        k = len(self.state_names)
        return ops.forward_eager(self.bound_form, rows, [], numbers[:k], list(tensors), numbers[k:], (), x.shape[1:],
                                 self)

    def tensor_args(self, values: dict[str, Any], x: Tensor, shape: tuple[int, ...]) -> list[Tensor]:
        """The tensor parameters as the kernels take them, in the compute dtype: [N] (`shape`: the neuron shape), one
        per channel, or [1] (also a tensor parameter left at its default)."""
        out = []
        compute = compute_dtype(x.dtype)
        for name, kind in self.tensors:
            value = values[name]
            if not isinstance(value, torch.Tensor):  # rounded as a scalar passed by value is: inf beyond the range
                value = torch.full((1,), representable(float(value), compute), dtype=compute, device=x.device)
            value = value.to(compute)
            if kind == PER_CHANNEL:
                out.append(value.reshape(-1))
            else:
                out.append(value.expand(shape).reshape(_numel(shape)) if kind else value.reshape(1))
        return out

    def kept_tensor_args(self, values: dict[str, Any], x: Tensor, shape: tuple[int, ...]) -> list[Tensor]:
        """`tensor_args`, the list kept while the same objects are given at the same addresses, where each of it is a
        view of its tensor (changes in place, also through `.data`, which counts no version, show in it) or made from
        a number, and none needs a gradient (views made under autograd are made anew each call)."""
        given = [values[name] for name, _ in self.tensors]
        addresses = [t.data_ptr() if isinstance(t, Tensor) else None for t in given]
        kept = self.kept_tensors
        if kept is not None and all(map(operator.is_, given, kept[0])) and addresses == kept[1]:
            return kept[2]
        tensors = self.tensor_args(values, x, shape)
        if self.tensors_kept and all(a is None or a == t.data_ptr() for a, t in zip(addresses, tensors)):
            self.kept_tensors = (given, addresses, tensors)
        return tensors

    def bind_backward(self, form: ops.ForwardForm, meta: tuple, saved: Sequence[Tensor], initial: Sequence[float],
                      params: Sequence[Tensor], scalars: Sequence[float]) -> None:
        """Bind the backward launches, without and with the final states' gradients, at the first backward
        (`ops._backward`; `meta`: x's shape, dtype, device; the rest in the backward op's argument order)."""
        if self.backward is not None:
            return
        grad = torch.zeros(*meta[:1], dtype=meta[1], device=meta[2])  # no random generator drawn from
        n, steps = grad.shape[-1], None if form.single else grad.shape[0]
        backend = "cuda" if grad.is_cuda else "host"
        launches = []
        for finals in (False, True) if form.finals else (False,):
            backward = ops.backward_form(form.key, form.single, form.given_inits, False, finals)
            given = [grad.new_zeros(n) for _ in form.finals] if finals else []
            launches.append(backward.kernel.bind((grad, *given, *saved, *initial, *params, *scalars), grad, n,
                                                 steps, backend))
        # the native node's gradients: x's, the initial states' (tensors), each learnable tensor parameter's (summed)
        inputs = backward.returns[:1 + (form.n_states if form.given_inits else 0)]
        learnable = form.config.learnable
        grads = (*((name, False) for name in inputs),
                 *((f"grad_{name}" if name in learnable else None, kind == SHARED) for name, kind in self.tensors))
        self.backward = (launches[0], launches[1] if len(launches) > 1 else None, grads)

    def plannable(self) -> bool:
        """Whether the native plan can be made now: the operator is loaded and a training program's backward bound."""
        return (not self.bound_form.save or self.backward is not None) and native.loaded()

    def native_plan(self, form: ops.ForwardForm, rows: Tensor, others: Sequence[Tensor], count: int) -> None:
        """Make the native plan at the first call that finds it `plannable` (none where the words cannot express the
        call): x's rows, the initial states where tensors, the tensor parameters, the count of numbers."""
        if self.plannable():
            self.native_wanted = False  # asked once
            try:
                words = plan_words(rows, others, count, self.launch, form, *(self.backward or (None, None, ())))
            except Unplannable:
                return
            self.native_call, self.native_layer_call = native.operator(), native.operator("layer_call")
            self.native_layer_states = native.operator("layer_call_states")
            self.native = native.make_plan(words.words, words.dtypes)  # last, as `launch` in `bind`


def _spread(value: Tensor) -> int:
    """How a tensor parameter spreads over the neurons, by its shape (part of the key): 0 one value; k > 0 one per
    index of the neuron shape's k-th dim from the end (a channel: [C, 1, ...]); -1 anything else (one per neuron)."""
    shape = value.shape
    if value.numel() == 1:
        return 0
    sized = [i for i, size in enumerate(shape) if size != 1]
    if len(sized) != 1 or sized[0] == len(shape) - 1:
        return -1
    # Backward sums per-channel gradients with atomics (their order varies): deterministic runs read them per neuron
    return -1 if torch.are_deterministic_algorithms_enabled() else len(shape) - sized[0]


def _kinds(spreads: dict[str, int]) -> tuple[dict[str, Broadcast], int]:
    """Each tensor parameter's broadcast kind and the channel dim (from the end; 0: none): per channel where every
    parameter spread over channels names the same dim (the kernels take one channel layout), else per neuron."""
    dims = {k for k in spreads.values() if k > 0}
    dim = dims.pop() if len(dims) == 1 else 0
    return {n: SHARED if k == 0 else PER_CHANNEL if dim and k == dim else PER_NEURON
            for n, k in spreads.items()}, dim


def _check_tensor_param(name: str, value: Tensor, x: Tensor, shape: tuple[int, ...]) -> None:
    if not value.is_floating_point():
        raise TypeError(f"parameter {name!r}: expected a floating tensor, got {value.dtype}")
    check_dense(f"parameter {name!r}", value)
    if value.device != x.device:
        raise ValueError(f"parameter {name!r}: on {value.device}, but the input is on {x.device}")
    if not broadcasts(tuple(value.shape), shape):
        raise ValueError(f"parameter {name!r}: shape {tuple(value.shape)} does not broadcast to the "
                         f"neuron shape {tuple(shape)}")  # a bound program's is a torch.Size


def as_float(what: str, value: float) -> float:
    """A number given as a Python int or float, as a float; ValueError naming `what` for an int beyond every float
    (float() raised OverflowError, naming nothing)."""
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{what}: an int of {int(value).bit_length()} bits, beyond the range of a float "
                         f"(at most 1024 bits)") from None


def representable(value: float, dtype: torch.dtype) -> float:
    """`value` as `dtype` rounds it where it lies beyond the dtype's range (an infinity from half a step past its
    largest number), which torch.full refuses rather than rounds; no tensor made (no copy to a device), and pure
    Python, which torch.compile traces."""
    largest = torch.finfo(dtype).max
    if not abs(value) > largest:  # in range, inf or NaN
        return value
    step = math.ldexp(torch.finfo(dtype).eps, math.frexp(largest)[1] - 1)  # the spacing of the largest numbers
    return math.copysign(math.inf if abs(value) >= largest + step / 2 else largest, value)


def check_dense(what: str, value: Tensor) -> None:
    """Refuse a sparse or nested tensor (the kernels read strided memory), naming `what`."""
    problem = dense_problem(what, value)
    if problem is not None:
        raise TypeError(problem)


# -- a call --------------------------------------------------------------------------------------------------------
class Call:
    """One call's arguments checked, defaults filled in, and matched to its program (found in `programs`, the
    owner's, unless the caller found it: `found`; built for this call alone under torch.compile, whose Dynamo traces
    the construction)."""

    def __init__(self, spec: Any, x: Tensor, shape: tuple[int, ...], states: Sequence[Tensor | float], surrogate: Any,
                 detach_reset: bool, reset: str | None, backend: str | None, params: dict[str, Any],
                 num_inputs: int = 1, save_h: bool = True, programs: Programs | None = None,
                 options: tuple[bool, bool, bool] = (False, False, True), found: Program | None = None):
        self.x, self.shape = x, shape
        self.numel = _numel(self.shape)
        self.compiling = torch.compiler.is_compiling()
        self.owned = not (self.compiling or transforms_active() or tracing_state() or forward_ad._current_level >= 0)
        # (owned: a program found in `programs`, which may bind)
        if not self.owned:
            program = Program(spec, surrogate, detach_reset, reset, backend, x, params, save_h,
                              eager=not self.compiling)
        elif found is not None:  # the caller looked the call's key up in `programs`
            program = found
        else:
            program = (programs if programs is not None else PROGRAMS).find(
                spec, x, states, surrogate, detach_reset, reset, backend, save_h, options, params)
        self.program = program
        self.backend, self.key, self.state_names = program.backend, program.key, program.state_names
        if not self.owned and not self.compiling and program.backend != "reference":
            _refuse_unrecorded(program)
        if num_inputs != len(program.inputs):
            several = f"a tuple of {len(program.inputs)} tensors" if len(program.inputs) > 1 else "one tensor"
            raise TypeError(f"neuron {program.name!r} takes {len(program.inputs)} step input(s) "
                            f"({', '.join(program.inputs)}): pass {several}, got {num_inputs}")
        self.values = program.values(params, x, self.shape)
        self.states = self._states(states)
        if forward_ad._current_level >= 0 and program.backend != "reference" and any(
                forward_ad.unpack_dual(t).tangent is not None
                for t in (x, *self.states, *self.values.values()) if isinstance(t, Tensor)):
            raise NotImplementedError(
                f"neuron {program.name!r}: autocuda's kernels (backend {program.backend!r}) carry no forward-mode "
                "tangents (torch.autograd.forward_ad, torch.func.jvp); build the layer, or make the call, with "
                "backend='reference'")

    def _states(self, states: Sequence[Tensor | float]) -> list[Tensor | float]:
        """Each state's initial value: a tensor of the neuron shape, or a number for every neuron."""
        names = self.state_names
        self.numbers = len(states) == len(names) and FLOATS.issuperset(map(type, states))
        if self.numbers:  # as after a reset: nothing to check
            return list(states)
        if len(states) > len(names):
            raise TypeError(f"neuron {self.program.name!r} has {len(names)} states ({', '.join(names)}), "
                            f"got {len(states)} initial values")
        values = [self._check_state(name, states[i]) if i < len(states) else self._initial(name)
                  for i, name in enumerate(names)]
        self.numbers = not any(isinstance(s, torch.Tensor) for s in values)
        return values

    def _check_state(self, name: str, state: Any) -> Tensor | float:
        x = self.x
        if isinstance(state, (int, float)) and not isinstance(state, bool):
            return as_float(f"state {name!r}", state)
        if not isinstance(state, torch.Tensor):
            raise TypeError(f"state {name!r}: expected a torch.Tensor or a number, got {type(state).__name__}")
        check_dense(f"state {name!r}", state)
        if tuple(state.shape) != self.shape:
            raise ValueError(f"state {name!r}: expected shape {self.shape} (the neuron shape), got "
                             f"{tuple(state.shape)}")
        if state.dtype != x.dtype:
            raise TypeError(f"state {name!r}: expected dtype {x.dtype} (the input's), got {state.dtype}")
        if state.device != x.device:
            raise ValueError(f"state {name!r}: on {state.device}, but the input is on {x.device}")
        return state

    def _initial(self, name: str) -> Tensor | float:
        init = self.program.inits[name]
        value = self.values[init] if isinstance(init, str) else init
        if isinstance(value, torch.Tensor):
            return value.detach().to(self.x.dtype).expand(self.shape).clone()
        return float(value)

    def state_tensors(self) -> list[Tensor]:
        """The initial states as tensors of the neuron shape (numbers filled in, rounded to x's dtype as the kernels
        take them: `representable`)."""
        return [s if isinstance(s, torch.Tensor) else self.x.new_full(self.shape, representable(s, self.x.dtype))
                for s in self.states]

    def tensor_args(self) -> list[Tensor]:
        return self.program.tensor_args(self.values, self.x, self.shape)

    def channel_sizes(self) -> list[float]:
        """The kernels' channel layout (`CHANNEL_KEYS`) as floats: channels, neurons per run of one channel."""
        dim = self.program.channel_dim
        inner = _numel(self.shape[len(self.shape) - dim + 1:])
        return [float(self.shape[len(self.shape) - dim]), float(inner)]

    def launch(self, x: Tensor, single_step: bool, store_state_seq: bool, final_states: bool,
               more: Sequence[Tensor] = ()) -> tuple[list[Tensor], tuple]:
        """The forward op's outputs and where they stand (`ops.ForwardForm.positions`); `more`: the step inputs after
        x. Eager calls give the final states in the neuron shape; a `bindable` program's call of one contiguous
        input runs its bound launch or its native plan."""
        program = self.program
        tensors = self.tensor_args() if program.tensors else []
        states: list[Tensor]
        initial: list[float]
        if self.numbers:  # the kernels start from the numbers (nothing to fill, read or differentiate)
            states, initial = [], self.states  # type: ignore[assignment]  # all numbers here
        else:
            states, initial = [as_rows(s, (self.numel,)) for s in self.state_tensors()], []
        save = torch.is_grad_enabled() and (x.requires_grad or any(t.requires_grad for t in (*more, *states, *tensors)))
        given: Sequence[float] = program.scalar_values(self.values)
        if program.channel_dim:
            given = [*given, *self.channel_sizes()]
        if self.compiling:
            outputs = torch.ops.autocuda.neuron_forward(self.key, x, states, initial, tensors, list(given),
                                                        store_state_seq, save, final_states, list(more))
            return outputs, ops.form_layout(self.key, single_step, store_state_seq, save, not initial, final_states)[0]
        form = ops.forward_form(self.key, single_step, store_state_seq, save, not initial, final_states)
        if program.bindable and not more and ENABLED and self.owned and self.x.is_contiguous():
            numbers = [*initial, *given]
            if program.launch is None:
                program.bind(form, x, [*(initial or states), *tensors, *given], self.numel, self.x)
            if program.native is None and program.native_wanted and native.USE:
                program.native_plan(form, x, [*states, *tensors], len(numbers))
            if program.native is not None and native.USE:
                return program.native_call(program.native, self.x, self.as_keyed(states, tensors), numbers), \
                    form.positions
            return ops.forward_eager(form, x, states, initial, tensors, given, (), self.shape, program), \
                form.positions
        return ops.forward_eager(form, x, states, initial, tensors, given, more, self.shape), form.positions

    def as_keyed(self, states: list[Tensor], tensors: list[Tensor]) -> list[Tensor]:
        """A native call's states ([N] rows) in x's neuron shape and its tensor parameters ([1]) in their own, as a
        layer's keyed call gives them (`Program.run_layer`): the native node saves what it is given, and
        torch.utils.checkpoint refuses a recomputation (a keyed call) that saves tensors of other shapes than its
        first run (this call, which made the plan)."""
        shape = self.shape
        params = [self.values[name] for name, _ in self.program.tensors]
        return [*(s if s.dim() == len(shape) else s.view(shape) for s in states),
                *(t.view(p.shape) if isinstance(p, Tensor) and t.shape != p.shape else t
                  for t, p in zip(tensors, params))]

    def reference_args(self, inputs: Sequence[Tensor]) -> tuple:
        """(x or the step inputs, states, params by symbol, surrogate, detach_reset) for the reference, in the compute
        dtype."""
        configured = config(self.key)
        system, symbols = configured.reference_step
        compute = compute_dtype(inputs[0].dtype)
        params = {symbols[n]: (v.to(compute) if isinstance(v, torch.Tensor) else v)
                  for n, v in self.values.items() if n in symbols}
        states = [s.to(compute) for s in self.state_tensors()]
        converted = tuple(u.to(compute) for u in inputs)
        return (converted[0] if len(converted) == 1 else converted, states, params, configured.surrogate,
                configured.detach_reset)


def _refuse_unrecorded(program: Program) -> None:
    """The kernels take no torch.func transform (their ops have no batching rule, their autograd no functorch form),
    and torch.jit.trace records no launch (its trace would return the tracing call's outputs as constants)."""
    kernels = f"neuron {program.name!r}: autocuda's kernels (backend {program.backend!r})"
    if functorch_active():
        raise NotImplementedError(
            f"{kernels} do not run under torch.func transforms (functorch transforms: grad, vmap, jacrev, ...); "
            "build the layer, or make the call, with backend='reference', whose torch ops they take")
    if tracing_state() is not None:
        raise NotImplementedError(
            f"{kernels} cannot be recorded by torch.jit.trace, which records no launch; torch.export.export and "
            "torch.compile take them (as custom ops), or trace with backend='reference'")


PROGRAMS = Programs(keeps_tensors=False)  # functional calls' programs (`functional.multi_step`, `single_step`)


def _reader(names: tuple[str, ...], floats: bool) -> Callable[[dict[str, Any]], Sequence[float]]:
    """The values of `names` in order, as floats: an itemgetter where they are floats already (not under
    torch.compile, whose Dynamo traces the list)."""
    if floats and len(names) > 1:
        return operator.itemgetter(*names)
    return lambda values: [float(values[n]) for n in names]


def neuron_shaped(final: Tensor, neuron_shape: tuple[int, ...]) -> Tensor:
    """A final state in the neuron shape: as the kernels wrote it in an eager call (no view: SpikingJelly's `detach_()`
    refuses views), else (the op's [N] under torch.compile) a view."""
    return final if final.dim() == len(neuron_shape) else final.view(neuron_shape)


def as_rows(t: Tensor, shape: tuple[int, ...]) -> Tensor:
    """`t` as a contiguous tensor of `shape` (the kernels' [T, N] or [N]): itself where it is one (a reshape would
    add a view and an autograd node to every call)."""
    if t.dim() == len(shape) and t.is_contiguous():
        return t
    return t.reshape(shape).contiguous()


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for size in shape:  # not math.prod: torch.compile traces a plain loop over (symbolic) sizes
        n = n * size
    return n
