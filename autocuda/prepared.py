"""Prepared eager calls: a `functional.multi_step` call like an earlier one runs from what the full path worked
out for that one (`calls.Call` and the op's form), without the argument handling in between.

A call is prepared where only numbers vary among what decides it: eager (neither traced nor under a functorch
transform), one contiguous step input of at least one step, on the CPU or a GPU, through the kernels' backends;
parameters given as numbers or None; initial states given as numbers or left out; no recompute. The key holds what
the full path's decisions depend on: the spec's and surrogate's identity, every option, the parameters' names and
types and the values of compile-time constants, the initial states' types, x's shape, dtype, device and address
alignment, and whether the call records a graph. Per call remain the numbers' domain checks, the scalars in kernel
order, the initial values, the outputs and the launch (`ops.forward_eager`).
"""
from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import native, ops
from .calls import SUPPORTED_DTYPES, Call, _names_a_file, layer_key, sequence_results
from .native.plan import Unplannable, plan_words

Tensor = torch.Tensor

_NUMBERS = frozenset({float, int})  # initial states' types a prepared call takes (bool is refused by the full path)
_PLAIN = frozenset({float, int, type(None)})  # parameters' types
_MAX_PREPARED = 1024  # keys hold shapes: a program whose shapes vary without end must not grow this
_UNPREPARED = object()  # a key whose calls the full path runs (the reference backend, tensor states by rule, ...)
_PREPARED: dict[tuple, Any] = {}
# whether a functorch transform (vmap, grad, ...) is active; a torch without the query counts as always
transforms_active: Callable[[], bool] = getattr(torch._C, "_are_functorch_transforms_active", lambda: True)
ENABLED = True  # False: every call takes the full path (tests and benchmarks compare the two)


class Prepared:
    """What the full path worked out for calls of one key: the layer, the op's form, the shapes."""

    def __init__(self, call: Call, params: dict[str, Any], store_state_seq: bool, final_states: bool, save: bool):
        layer = self.layer = call.layer
        x = call.x
        self.shape, self.neuron_shape = tuple(x.shape), call.shape
        self.rows = (self.shape[0], call.numel)
        self.flat = len(self.shape) == 2  # x is [T, N] already: so are the outputs
        self.inits = tuple(layer.inits[name] for name in layer.state_names)
        self.options = (final_states, store_state_seq)
        form = layer.form(False, store_state_seq, save, False, final_states)
        rows = x.view(self.rows)
        args = (rows, *call.states, *layer.scalar_values(call.values))  # the kernel's, for its layout
        backend = "cuda" if x.is_cuda else "host"  # the kernels' backends run CPU tensors on the host runner
        self.form = ops.BoundForm(form, form.kernel.bind(args, rows, call.numel, self.shape[0], backend))
        self.native: int | None = None  # the native plan (`autocuda.native`), made once its operator is loaded
        self.native_asked = not (x.is_cuda or native.HOST)  # a host call takes the Python path unless asked
        self.native_call: Callable[[int, Tensor, Sequence[float]], list[Tensor]] = native.call
        spike, finals, _ = self.form.positions  # the usual results, [T, N] and final states, picked at once:
        self.pick = operator.itemgetter(spike, *finals) if (
            self.flat and finals and final_states and not store_state_seq) else None

    def __call__(self, x: Tensor, initial_states: Sequence[float], params: dict[str, Any]
                 ) -> tuple[Tensor, tuple[Tensor, ...] | None, tuple[Tensor, ...] | None]:
        layer = self.layer
        values = layer.values(params, x, self.neuron_shape)  # the numbers' domain checks, the defaults
        initial = list(map(float, initial_states))
        for init in self.inits[len(initial):]:
            initial.append(float(values[init]) if isinstance(init, str) else init)
        scalars = layer.scalar_values(values)
        plan = (self.native if self.native_asked else self._plan(x, initial, scalars)) if native.USE else None
        if plan is not None:  # the operator runs x as rows and gives the final states in the neuron shape
            outputs = self.native_call(plan, x, [*initial, *scalars])
        else:
            rows = x if self.flat else x.view(self.rows)
            outputs = ops.forward_eager(self.form, rows, [], initial, [], scalars, (), self.neuron_shape)
        if self.pick is not None:
            picked = self.pick(outputs)
            return picked[0], picked[1:], None
        return sequence_results(outputs, self.form.positions, None if self.flat else self.shape, self.neuron_shape,
                                *self.options)

    def settled(self, x: Tensor, params: dict[str, Any]) -> tuple[int, tuple[float, ...]] | None:
        """The native plan and the kernel's scalars of this call with `params` (checked as a call checks them), for
        a layer that calls again with the same parameters and numbers for initial states (`nn.layer_call`); None
        without a native plan, or where the call keeps state sequences or no final states."""
        if self.native is None or self.options != (True, False):
            return None
        return self.native, tuple(self.layer.scalar_values(self.layer.values(params, x, self.neuron_shape)))

    def _plan(self, x: Tensor, initial: list[float], scalars: Sequence[float]) -> int | None:
        """The native plan, made on the first call that finds the native operator loaded."""
        if native.loaded():
            self.native_asked = True
            self.native_call = native.operator()
            self.native = self._native_plan(x.view(self.rows), [*initial, *scalars])
        return self.native

    def _native_plan(self, rows: Tensor, numbers: list[float]) -> int | None:
        """This call's native plan, or None where a plan cannot express it (state sequences among the outputs,
        scalars of packed half types, a kernel that launches nothing)."""
        if self.options[1]:
            return None
        form = self.form
        try:
            backward = self._backward_launches(rows, numbers) if form.save else (None, None, "")
            words = plan_words(rows, len(numbers), form.launch, form, *backward)
        except Unplannable:
            return None
        return native.make_plan(words.words, words.dtypes)

    def _backward_launches(self, rows: Tensor, numbers: list[float]) -> tuple:
        """The backward kernels bound to this call's shape, without and with the final states' gradients, and
        the name of grad_x among their outputs. They are bound as the Python path binds them: the gradients fresh
        (aligned) tensors, the saved tensors a forward's outputs (and x)."""
        form = self.form
        outputs = form.launch((rows, *numbers), rows)
        saved = [(rows, *outputs)[at] for at in form.picks]
        grad = rows.detach().clone()  # data to time layouts on, drawn from no random generator (the caller's)
        steps, n = self.rows
        backend = "cuda" if rows.is_cuda else "host"
        launches = []
        for finals in (False, True) if form.finals else (False,):
            backward = ops.backward_form(form.key, False, False, False, finals)
            given = [grad.new_zeros(n) for _ in form.finals] if finals else []
            launches.append(backward.kernel.bind((grad, *given, *saved, *numbers), grad, n, steps, backend))
        with_finals = launches[1] if len(launches) > 1 else None
        return launches[0], with_finals, backward.returns[0]


def multi_step(spec: Any, x: Any, initial_states: tuple, surrogate: Any, detach_reset: bool, reset: Any,
               store_state_seq: bool, final_states: bool, backend: Any, save_h: bool, params: dict[str, Any]
               ) -> tuple | None:
    """`functional.multi_step`'s results for a prepared call, or None where the full path runs it."""
    prepared = _lookup(spec, x, initial_states, surrogate, detach_reset, reset, store_state_seq, final_states,
                       backend, save_h, params)
    return None if prepared is None else prepared(x, initial_states, params)


class LastCall:
    """A layer's last prepared call and the check of the call it was made for (`layer_multi_step`), stored as one
    pair so that a thread never reads one call's check with another's prepared call. It holds no tensor and is not
    copied with its layer: a deep copy or an unpickled layer starts with an empty one."""

    __slots__ = ("entry", "constants", "settled")

    def __init__(self) -> None:
        self.entry: tuple[tuple, Prepared] | None = None
        self.constants: tuple[str, ...] = ()  # the spec's compile-time constants, whose values the check holds
        self.settled: tuple | None = None  # what the layer keeps to rerun the call without the check (nn.layer_call)

    @property
    def prepared(self) -> Prepared | None:
        return None if self.entry is None else self.entry[1]

    def __reduce__(self) -> tuple:
        return LastCall, ()


def layer_multi_step(last: LastCall, spec: Any, x: Any, initial_states: tuple, surrogate: Any, detach_reset: bool,
                     store_state_seq: bool, backend: Any, save_h: bool, params: dict[str, Any]) -> tuple | None:
    """`multi_step`'s results for a layer's eager call (the spec's reset, final states kept), or None where the
    full path runs it. A call whose check (`_check`) equals that of the layer's last prepared call runs that call
    without building its key: a layer calls with the same configuration, shapes and types again and again."""
    if not ENABLED or type(x) is not Tensor or transforms_active():
        return None
    check = _check(last, spec, x, initial_states, surrogate, detach_reset, store_state_seq, backend, save_h, params)
    entry = last.entry
    if entry is not None and check == entry[0]:
        return entry[1](x, initial_states, params)
    prepared = _lookup(spec, x, initial_states, surrogate, detach_reset, None, store_state_seq, True, backend,
                       save_h, params)
    if prepared is None:
        return None
    last.constants = prepared.layer.constant_names  # the spec's: the same for every call of the layer
    last.entry = (_check(last, spec, x, initial_states, surrogate, detach_reset, store_state_seq, backend, save_h,
                         params), prepared)
    return prepared(x, initial_states, params)


def _check(last: LastCall, spec: Any, x: Tensor, initial_states: tuple, surrogate: Any, detach_reset: bool,
           store_state_seq: bool, backend: Any, save_h: bool, params: dict[str, Any]) -> tuple:
    """Whatever `_key` reads from a layer's call that may differ between two calls of one layer: the layer's
    references and switches, x's shape, dtype, device, alignment, contiguity and whether it records a graph, the
    initial states' types, the parameters' names and types and the compile-time constants' values. The
    eligibility `_key` asks of the call (numbers only, a contiguous x of at least one step) follows from equal
    checks: the check a layer keeps is that of a call `_key` took."""
    constants = tuple(params.get(name) for name in last.constants) if last.constants else ()
    return (spec, surrogate, detach_reset, store_state_seq, backend, save_h, x.shape, x.dtype, x.device,
            x.data_ptr() & 15, x.is_contiguous(), torch.is_grad_enabled() and x.requires_grad,
            tuple(map(type, initial_states)), tuple(params), tuple(map(type, params.values())), constants)


def _lookup(spec: Any, x: Any, initial_states: tuple, surrogate: Any, detach_reset: bool, reset: Any,
            store_state_seq: bool, final_states: bool, backend: Any, save_h: bool, params: dict[str, Any]
            ) -> Prepared | None:
    """The prepared call of these arguments (prepared now where its key is new), or None where the full path
    runs it."""
    if not ENABLED:
        return None
    key = _key(spec, x, initial_states, surrogate, detach_reset, reset, store_state_seq, final_states, backend,
               save_h, params)
    if key is None:
        return None
    try:
        prepared = _PREPARED.get(key)
    except TypeError:  # an unhashable argument: the full path's checks name it
        return None
    if prepared is None:
        prepared = _prepare(key, spec, x, initial_states, surrogate, detach_reset, reset, store_state_seq,
                            final_states, backend, save_h, params)
    return None if prepared is _UNPREPARED else prepared


def _key(spec: Any, x: Any, initial_states: tuple, surrogate: Any, detach_reset: bool, reset: Any,
         store_state_seq: bool, final_states: bool, backend: Any, save_h: bool, params: dict[str, Any]
         ) -> tuple | None:
    """The key of a call that may be prepared (see the module's docstring), else None."""
    if type(x) is not Tensor or x.dtype not in SUPPORTED_DTYPES or not _NUMBERS.issuperset(map(type, initial_states)):
        return None
    types = tuple(map(type, params.values()))
    if not _PLAIN.issuperset(types) or torch.compiler.is_compiling() or transforms_active():
        return None
    if x.is_cuda:
        device = x.get_device()
    elif x.is_cpu:
        device = -1
    else:
        return None
    shape = x.shape
    if len(shape) < 2 or not shape[0] or not x.is_contiguous():
        return None
    if type(spec) is str and _names_a_file(spec):  # the full path reads the file as it is now
        return None
    try:
        layer = layer_key(spec, surrogate, detach_reset, reset, backend, save_h, x.is_cuda, params, types)
    except TypeError:  # a spec of the wrong type: the full path names it
        return None
    grad = torch.is_grad_enabled() and x.requires_grad
    return (layer, shape, x.dtype, device, x.data_ptr() & 15, grad, store_state_seq, final_states,
            tuple(map(type, initial_states)))


def _prepare(key: tuple, spec: Any, x: Tensor, initial_states: tuple, surrogate: Any, detach_reset: bool,
             reset: Any, store_state_seq: bool, final_states: bool, backend: Any, save_h: bool,
             params: dict[str, Any]) -> Any:
    """The prepared call of `key` (checked by the full path's `Call`), or `_UNPREPARED` where its calls take the
    full path: the reference backend, several step inputs, tensors among the kernel's arguments."""
    call = Call(spec, x, tuple(x.shape[1:]), initial_states, surrogate, detach_reset, reset, backend, params, 1,
                save_h)
    layer = call.layer
    if x.is_cuda and torch.cuda.is_current_stream_capturing():
        return _UNPREPARED  # not kept: a capture takes the fixed rules' layout where a later call would time one
    eligible = call.backend != "reference" and call.numbers and not layer.tensors and len(layer.inputs) == 1
    prepared = Prepared(call, params, store_state_seq, final_states, key[5]) if eligible else _UNPREPARED
    if len(_PREPARED) >= _MAX_PREPARED:
        _PREPARED.clear()
    _PREPARED[key] = prepared
    return prepared
