"""The generated neuron kernels as PyTorch operators: `torch.library.custom_op`s with fake (meta) kernels and
autograd, so `opcheck`, `torch.compile(fullgraph=True)` and CUDA graphs see an ordinary operator.

Schemas must be static, while neurons differ in states, parameters and saved tensors. So there is one small
family of two operators, and a string `key` names the neuron layer they run (its `NeuronConfig`):

    autocuda::neuron_forward(str key, Tensor x, Tensor[] states, float[] initial, Tensor[] tensor_params,
                             float[] scalars, bool store_state_seq, bool save_for_backward,
                             bool final_states, Tensor[] more_inputs) -> Tensor[]
    autocuda::neuron_backward(str key, Tensor grad_spike, Tensor[] grad_finals, Tensor[] grad_seqs,
                              Tensor[] saved, float[] initial, Tensor[] tensor_params, float[] scalars)
                              -> Tensor[]

x is [T, N] (the multi-step kernels) or [N] (the single-step kernels); a spec with several step inputs takes
the first as x and the others, of x's shape, as `more_inputs` (in the spec's order; [] for one input), and
backward returns each one's gradient after grad_x. The initial states are either
`states`, [N] each in x's dtype, or `initial`, one number each for every neuron (the kernels then start from
it: no tensor to fill and read, and no gradient for it); the other list is empty. Tensor parameters are [N]
(one per neuron) or [1] (shared) in the compute dtype; scalars go to the kernel by value.
Forward returns the kernel's outputs in its declaration order (`forward_outputs`): spike_seq, h_seq (when
saving), state sequences (stored or saved), final states (unless final_states is False: a multi-step forward
then writes none, and backward gets no gradients of them). Backward takes either a gradient for every final
state or none (grad_finals = []: a kernel that starts from zero, no zero tensors to fill), gradients of the
state sequences or none, and returns grad_x, the gradient of each initial state, then one per-neuron partial
sum per learnable parameter (`NeuronConfig.learnable`); with `initial` numbers, no gradients of initial states.

A third op runs one pass of a BPTT in two (a fused BatchNorm's backward, `nn.batchnorm_passes`):

    autocuda::neuron_backward_part(str key, str gradients, Tensor grad_spike, Tensor[] grad_finals,
                                   Tensor[] saved, float[] initial, Tensor[] tensor_params, float[] scalars,
                                   Tensor[] correction) -> Tensor[]

with `gradients` "sums" (the per-channel sums alone) or "corrected" (every other gradient, the input's with
c1[c] * x + c0[c] added; `correction` = [c1, c0]).

Keys are a readable spec name plus a digest of everything that selects the kernels, identical in every
process; torch.compile guards on them like on any string constant. CUDA tensors run the kernels, compiled by
NVRTC, through the CUDA driver on torch's current stream; CPU tensors run the same generated source through the
host runner.
"""
from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from typing import Any

import torch

from ..codegen.broadcast import CORRECTION_KEYS
from ..runtime import configs, neuron_launch, tuning
from ..runtime.configs import compute_dtype, constant_result
from ..runtime.neuron_launch import NeuronConfig

Tensor = torch.Tensor


def entry(key: str) -> NeuronConfig:
    """The configuration an op key names (`runtime.configs`), refused unless it runs kernels."""
    found = configs.config(key)
    if found.reference:
        raise KeyError(f"autocuda neuron key {key!r} names a configuration of the torch reference (no kernels)")
    return found


@functools.lru_cache(maxsize=1024)
def forward_outputs(key: str, single_step: bool, store_state_seq: bool, save: bool, final_states: bool = True
                    ) -> tuple[str, ...]:
    """Names of neuron_forward's outputs, in order."""
    kind = "step-forward" if single_step else "fptt"
    kernel = entry(key).kernel(kind, torch.float32, store_state_seq=store_state_seq, save_for_backward=save,
                               final_states=final_states)
    return tuple(n for n, p in kernel.cparams.items() if p.pointer and not p.const)


@functools.lru_cache(maxsize=1024)
def saved_names(key: str, single_step: bool, given_inits: bool = True) -> tuple[str, ...]:
    """What the backward kernel reads besides gradients and parameters: h_seq, x_seq (where `needs_x`),
    <state>_init/_seq (the initial states only when given as tensors). Autograd saves exactly these."""
    e = entry(key)
    kernel = e.kernel("step-backward" if single_step else "bptt", torch.float32, given_inits=given_inits)
    skip = set(e.tensor_names) | set(e.op_scalars)
    return tuple(n for n, p in kernel.cparams.items()
                 if p.pointer and p.const and not n.startswith("grad_") and n not in skip)


def _check_counts(key: str, what: Sequence[str], expected: Sequence[int], got: Sequence[Sequence]) -> None:
    """Refuse the first of a call's argument lists (`got`, named by `what`) whose length is not `expected`'s."""
    for label, count, given in zip(what, expected, got):
        if len(given) != count:
            raise ValueError(f"autocuda.neuron_*: {entry(key).spec.name!r} takes {count} {label}, got {len(given)}")


# -- the forms of a call, worked out once: names, kernel options and argument order are no per-call work ----------
class ForwardForm:
    """neuron_forward for one (key, single step?, store_state_seq, save_for_backward, initial states as tensors?,
    final states written?): the kernel's kind and options, the op's inputs by kernel name in op order, its
    outputs, and for autograd where the outputs it differentiates stand, what to save and how parameter
    gradients are shaped."""

    def __init__(self, key: str, single: bool, store_state_seq: bool, save: bool, given_inits: bool,
                 final_states: bool = True):
        e = entry(key)
        self.key, self.config, self.single, self.save, self.given_inits = key, e, single, save, given_inits
        self.n_states = len(e.state_names)
        self.n_more = len(e.input_keys) - 1  # step inputs after x
        inputs = e.op_inputs
        self.kernel = neuron_launch.KernelCall(e, "step-forward" if single else "fptt",
                                        (store_state_seq, save, given_inits, final_states), inputs)
        self.counts = (len(e.state_names), len(e.tensor_names), len(e.op_scalars))  # initial states, tensors, scalars
        self.outputs = forward_outputs(key, single, store_state_seq, save, final_states)
        self.spike_at = self.outputs.index("spike_seq")
        self.finals = tuple(self.outputs.index(f"{s}_final") for s in e.state_names) if final_states else ()
        self.seqs = tuple(self.outputs.index(f"{s}_seq") for s in e.state_names) if store_state_seq else ()
        self.positions = (self.spike_at, self.finals, self.seqs)
        if save:  # outputs written for backward alone (h_seq, unasked state sequences); what backward reads, among
            # (x, the step inputs after it, the initial states given as tensors, the outputs)
            shown = (self.spike_at, *self.finals, *self.seqs)
            self.hidden = tuple(i for i in range(len(self.outputs)) if i not in shown)
            inits = [f"{s}_init" for s in e.state_names] if given_inits else []
            available = (*e.input_keys, *inits, *self.outputs)
            self.picks = tuple(available.index(name) for name in saved_names(key, single, given_inits))
        # Per tensor parameter, in op order: where its partial stands among backward's (None: not learnable),
        # and whether it is one per neuron (else shared: [1], the partials summed).
        self.param_grads = tuple((e.learnable.index(name) if name in e.learnable else None, per_neuron)
                                 for name, per_neuron in e.tensors)

    def run(self, x: Tensor, states: Sequence[Tensor], initial: Sequence[float], tensor_params: Sequence[Tensor],
            scalars: Sequence[float], more_inputs: Sequence[Tensor] = (), final_shape: Sequence[int] | None = None
            ) -> list[Tensor]:
        """The kernel's outputs in parameter order (`outputs`); the final states in `final_shape` (the neuron
        shape, of N values) where it is given, else [N]."""
        chosen = states or initial
        if (len(chosen), len(tensor_params), len(scalars)) != self.counts or (states and initial):
            self._refuse(states, initial, tensor_params, scalars)
        shape = x.shape
        if len(more_inputs) != self.n_more or (more_inputs and any(u.shape != shape for u in more_inputs)):
            self._refuse_inputs(x, more_inputs)
        n, steps = shape[-1], (None if self.single else shape[0])
        _, outputs = self.kernel((x, *more_inputs, *chosen, *tensor_params, *scalars), x, n, steps,
                                 "cuda" if x.is_cuda else "host", final_shape)
        if steps == 0:  # no step ran: the final states are the initial ones
            for i, state in zip(self.finals, states):
                outputs[i].view(state.shape).copy_(state)
            for i, value in zip(self.finals, initial):
                outputs[i].fill_(value)
        return outputs

    def _refuse_inputs(self, x: Tensor, more_inputs: Sequence[Tensor]) -> None:
        spec = self.config.spec
        raise ValueError(f"autocuda.neuron_forward: {spec.name!r} takes {self.n_more + 1} step input(s) "
                         f"({', '.join(spec.inputs)}) of one shape, got shapes "
                         f"{[tuple(u.shape) for u in (x, *more_inputs)]}")

    def _refuse(self, states: Sequence[Tensor], initial: Sequence[float], tensor_params: Sequence[Tensor],
                scalars: Sequence[float]) -> None:
        if states and initial:
            raise ValueError("autocuda.neuron_forward: give the initial states as tensors or as numbers, not both")
        e = self.config
        if len(states or initial) != len(e.state_names):
            raise ValueError(f"autocuda.neuron_forward: {e.spec.name!r} has {len(e.state_names)} states "
                             f"({', '.join(e.state_names)}), got {len(states or initial)} initial values")
        _check_counts(self.key, ("tensor parameters", "scalars"), self.counts[1:], (tensor_params, scalars))


@constant_result  # under torch.compile a constant: Dynamo does not trace the forms' construction
def form_layout(key: str, single: bool, store_state_seq: bool, save: bool, given_inits: bool, final_states: bool
                ) -> tuple[tuple[int, tuple[int, ...], tuple[int, ...]], tuple[int, ...], tuple[str, ...]]:
    """Of a forward op's call of this form: where its outputs stand (`ForwardForm.positions`), what autograd saves
    where it saves (`ForwardForm.picks`), and the learnable parameters in order."""
    form = forward_form(key, single, store_state_seq, save, given_inits, final_states)
    return form.positions, form.picks if save else (), entry(key).learnable


@functools.cache  # as many as the configurations (`runtime.configs`), each at most 32
def forward_form(key: str, single: bool, store_state_seq: bool, save: bool, given_inits: bool,
                 final_states: bool = True) -> ForwardForm:
    """The form of a neuron_forward call (`forward_eager` takes it), worked out once."""
    return ForwardForm(key, single, store_state_seq, save, given_inits, final_states)


class _BackwardForm:
    """neuron_backward for one (key, single step?, initial states as tensors?, state sequence gradients given?,
    final state gradients given?, what it stores: `gradients`): the kernel's kind and options, the op's inputs by
    kernel name in op order, and the names of what it returns."""

    def __init__(self, key: str, single: bool, given_inits: bool, grad_state_seq: bool, grad_finals: bool,
                 gradients: str = "all"):
        e = entry(key)
        self.key, self.single = key, single
        saved = saved_names(key, single, given_inits)
        finals = tuple(f"grad_{s}_final" for s in e.state_names) if grad_finals else ()
        seqs = tuple(f"grad_{s}_seq" for s in e.state_names) if grad_state_seq else ()
        numbers = () if given_inits else tuple(f"{s}_init" for s in e.state_names)
        terms = CORRECTION_KEYS if gradients == "corrected" else ()
        inputs = ("grad_spike_seq", *finals, *seqs, *saved, *numbers, *e.tensor_names, *e.op_scalars, *terms)
        flags = (grad_state_seq, grad_finals, given_inits) + (() if gradients == "all" else (gradients,))
        self.kernel = neuron_launch.KernelCall(e, "step-backward" if single else "bptt", flags, inputs)
        self.counts = tuple(map(len, (finals, seqs, saved, numbers, e.tensor_names, e.op_scalars, terms)))
        sums = gradients == "sums"
        channel = e.channel_sums
        self.returns = (*(() if sums else (f"grad_{k}" for k in e.input_keys)),
                        *(f"grad_{s}_init" for s in e.state_names if given_inits and not sums),
                        *(name for name in (f"grad_{p}" for p in e.learnable)
                          if gradients == "all" or (name in channel) == sums))
        self.n_inputs = 0 if sums else len(e.input_keys)
        self.n_inits = len(e.state_names) if given_inits and not sums else 0

    def run(self, grad_spike: Tensor, grad_finals: Sequence[Tensor], grad_seqs: Sequence[Tensor],
            saved: Sequence[Tensor], initial: Sequence[float], tensor_params: Sequence[Tensor],
            scalars: Sequence[float], correction: Sequence[Tensor] = ()) -> list[Tensor]:
        """grad_x (of each step input), the gradient of each initial state given as a tensor, each learnable
        parameter's partials (of a pass: those it stores). `correction`: c1 and c0 (`gradients="corrected"`)."""
        if (len(grad_finals), len(grad_seqs), len(saved), len(initial), len(tensor_params), len(scalars),
                len(correction)) != self.counts:  # `len` each: cheaper than a map over the lists
            _check_counts(self.key, _BACKWARD_LISTS, self.counts,
                          (grad_finals, grad_seqs, saved, initial, tensor_params, scalars, correction))
        args = (grad_spike, *grad_finals, *grad_seqs, *saved, *initial, *tensor_params, *scalars, *correction)
        shape = grad_spike.shape
        n, steps = shape[-1], (None if self.single else shape[0])
        names, outputs = self.kernel(args, grad_spike, n, steps, "cuda" if grad_spike.is_cuda else "host")
        if names == self.returns:  # the kernel's outputs are what the op returns, in order (e.g. grad_x alone)
            result = outputs
        else:
            out = dict(zip(names, outputs))
            result = [out[name] for name in self.returns]
        if steps == 0:  # no step ran: gradients pass straight through
            first = self.n_inputs
            for i, init in enumerate(result[first:first + self.n_inits]):
                if grad_finals:
                    init.copy_(grad_finals[i])
                else:
                    init.zero_()
            for partial in result[first + self.n_inits:]:
                partial.zero_()
        return result


_BACKWARD_LISTS = ("final state gradients", "state sequence gradients", "saved tensors", "initial values",
                   "tensor parameters", "scalars", "correction terms")


@functools.cache
def backward_form(key: str, single: bool, given_inits: bool, grad_state_seq: bool, grad_finals: bool,
                   gradients: str = "all") -> _BackwardForm:
    return _BackwardForm(key, single, given_inits, grad_state_seq, grad_finals, gradients)


# -- forward ----------------------------------------------------------------------------------------------
def _forward_impl(key: str, x: Tensor, states: list[Tensor], initial: list[float], tensor_params: list[Tensor],
                  scalars: list[float], store_state_seq: bool, save_for_backward: bool, final_states: bool,
                  more_inputs: list[Tensor]) -> list[Tensor]:
    form = forward_form(key, x.dim() == 1, store_state_seq, save_for_backward, not initial, final_states)
    return form.run(x, states, initial, tensor_params, scalars, more_inputs)


neuron_forward = torch.library.custom_op("autocuda::neuron_forward", _forward_impl, mutates_args=())


@neuron_forward.register_fake
def _forward_fake(key, x, states, initial, tensor_params, scalars, store_state_seq, save_for_backward,
                  final_states, more_inputs):
    single, n = x.dim() == 1, x.shape[-1]
    steps = None if single else x.shape[0]
    kernel = entry(key).kernel("step-forward" if single else "fptt", x.dtype, store_state_seq=store_state_seq,
                                      save_for_backward=save_for_backward, final_states=final_states,
                                      **({} if single else tuning.replay_option(n, steps)))
    shapes = {"vector": (n,), "sequence": x.shape}
    if kernel.checkpoint_steps:  # multi-step only: a row every so many steps
        shapes["checkpoints"] = (steps // kernel.checkpoint_steps, n)
    return [x.new_empty(shapes[neuron_launch.output_kind(name)], dtype=p.torch_dtype)
            for name, p in kernel.cparams.items() if p.pointer and not p.const]


# -- backward ---------------------------------------------------------------------------------------------
def _backward_impl(key: str, grad_spike: Tensor, grad_finals: list[Tensor], grad_seqs: list[Tensor],
                   saved: list[Tensor], initial: list[float], tensor_params: list[Tensor], scalars: list[float]
                   ) -> list[Tensor]:
    form = backward_form(key, grad_spike.dim() == 1, not initial, bool(grad_seqs), bool(grad_finals))
    return form.run(grad_spike, grad_finals, grad_seqs, saved, initial, tensor_params, scalars)


neuron_backward = torch.library.custom_op("autocuda::neuron_backward", _backward_impl, mutates_args=())


@neuron_backward.register_fake
def _backward_fake(key, grad_spike, grad_finals, grad_seqs, saved, initial, tensor_params, scalars):
    form = backward_form(key, grad_spike.dim() == 1, not initial, bool(grad_seqs), bool(grad_finals))
    return _gradients_like(key, form.returns, grad_spike, tensor_params)


def _gradients_like(key: str, names: Sequence[str], grad_spike: Tensor, tensor_params: Sequence[Tensor]
                    ) -> list[Tensor]:
    """Empty tensors shaped as the gradients `names` that a backward op returns (fake kernels): a step input's
    like the spikes' gradient, an initial state's one per neuron, a learnable parameter's partials one per neuron
    in the compute dtype, or one per channel (its sum) shaped like the parameter."""
    e = entry(key)
    compute = compute_dtype(grad_spike.dtype)
    sums = e.channel_sums
    sizes = {f"grad_{name}": value.shape for name, value in zip(e.tensor_names, tensor_params)}
    inputs = {f"grad_{k}" for k in e.input_keys}
    neurons = grad_spike.shape[-1:]
    return [grad_spike.new_empty(grad_spike.shape) if name in inputs
            else grad_spike.new_empty(neurons) if name.endswith("_init")
            else grad_spike.new_empty(sizes[name] if name in sums else neurons, dtype=compute) for name in names]


def _backward_part_impl(key: str, gradients: str, grad_spike: Tensor, grad_finals: list[Tensor], saved: list[Tensor],
                        initial: list[float], tensor_params: list[Tensor], scalars: list[float],
                        correction: list[Tensor]) -> list[Tensor]:
    """One pass of a BPTT in two (`gradients`: "sums", then "corrected" with c1 and c0 in `correction`; a
    multi-step layer with per-channel parameters, no state sequences): what `_BackwardForm.returns` names."""
    if gradients not in ("sums", "corrected"):
        raise ValueError(f"autocuda.neuron_backward_part: gradients 'sums' or 'corrected', got {gradients!r}")
    form = backward_form(key, False, not initial, False, bool(grad_finals), gradients)
    return form.run(grad_spike, grad_finals, (), saved, initial, tensor_params, scalars, correction)


neuron_backward_part = torch.library.custom_op("autocuda::neuron_backward_part", _backward_part_impl,
                                               mutates_args=())


@neuron_backward_part.register_fake
def _backward_part_fake(key, gradients, grad_spike, grad_finals, saved, initial, tensor_params, scalars, correction):
    form = backward_form(key, False, not initial, False, bool(grad_finals), gradients)
    return _gradients_like(key, form.returns, grad_spike, tensor_params)


def backward_part(key: str, gradients: str, *args: Any) -> list[Tensor]:
    """`autocuda::neuron_backward_part` (the op under torch.compile, its implementation otherwise) of the op's
    arguments after `gradients`."""
    run = torch.ops.autocuda.neuron_backward_part if torch.compiler.is_compiling() else _backward_part_impl
    return run(key, gradients, *args)


# -- autograd -------------------------------------------------------------------------------------------------
def _setup_context(ctx, inputs, output) -> None:
    key, x, states, initial, tensor_params, scalars, store_state_seq, save, final_states, more_inputs = inputs
    form = forward_form(key, x.dim() == 1, store_state_seq, save, not initial, final_states)
    _save_context(ctx, form, x, states, list(initial), tensor_params, list(scalars), output, more_inputs)


def _save_context(ctx, form: ForwardForm, x: Tensor, states: Sequence[Tensor], initial: list[float],
                  tensor_params: Sequence[Tensor], scalars: list[float], output: Sequence[Tensor],
                  more_inputs: Sequence[Tensor] = (), program: Any = None) -> None:
    """What backward needs: the form, the numbers (lists the caller no longer changes), x's metadata, the
    saved tensors (those the backward kernel reads, then the tensor parameters) and the call's program (whose
    backward launches are bound at its first backward)."""
    ctx.form, ctx.outputs, ctx.program = form, form.outputs, program
    ctx.scalars, ctx.initial = scalars, initial
    ctx.meta = (x.shape, x.dtype, x.device)
    if form.save:
        available = (x, *more_inputs, *states, *output)
        ctx.save_for_backward(*map(available.__getitem__, form.picks), *tensor_params)


def _backward(ctx, grads: list[Tensor], run_backward: Any = None):
    """The op's gradients: `neuron_backward` (`run_backward`: its implementation, for the eager twin) of what
    `_save_context` kept."""
    form: ForwardForm = ctx.form
    if not form.save:
        raise RuntimeError("autocuda.neuron_forward ran with save_for_backward=False; backward needs it True")
    saved, n = ctx.saved_tensors, len(form.picks)
    shape, dtype, device = ctx.meta
    finals = _dense_all(grads, form.finals, shape, True, dtype, device)  # none given: a kernel taking zeros
    seqs = _dense_all(grads, form.seqs, shape, False, dtype, device) if form.seqs else []
    grad_spike = _dense(grads[form.spike_at], shape, dtype, device)
    program = ctx.program
    if program is not None and program.native_wanted:
        program.bind_backward(form, ctx.meta, list(saved[:n]), ctx.initial, list(saved[n:]), ctx.scalars)
    out = (run_backward or neuron_backward)(form.key, grad_spike, finals, seqs, list(saved[:n]), ctx.initial,
                                            list(saved[n:]), ctx.scalars)
    n_inits, n_inputs = (0 if ctx.initial else form.n_states), 1 + form.n_more
    grad_inputs, grad_states, partials = out[:n_inputs], out[n_inputs:n_inputs + n_inits], out[n_inputs + n_inits:]
    # a shared parameter ([1]) gets the sum over neurons; torch's sum is deterministic
    grad_params = [None if at is None else partials[at] if per_neuron else partials[at].sum(0, keepdim=True)
                   for at, per_neuron in form.param_grads] if form.param_grads else []
    # float[] arguments get None, except an empty one: torch matches it as an empty list of gradients
    return (None, grad_inputs[0], list(grad_states), None if ctx.initial else [], grad_params, None, None, None, None,
            list(grad_inputs[1:]))


def _dense(grad: Tensor | None, shape, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Gradients reach backward as zeros, expanded views or None; the kernel reads contiguous ones."""
    if grad is None:
        return torch.zeros(shape, dtype=dtype, device=device)
    return grad.contiguous()


def _dense_all(grads: Sequence[Tensor | None], at: tuple[int, ...], shape, per_neuron: bool, dtype: torch.dtype,
               device: torch.device) -> list[Tensor]:
    """The gradients at `at` (of per-neuron outputs, or of outputs shaped like x), dense; none at all when none
    was given. (`map` over C callables rather than generator expressions: this runs on every backward.)"""
    chosen = list(map(grads.__getitem__, at))
    if all(map(_is_none, chosen)):
        return []
    shape = shape[-1:] if per_neuron else shape
    return [_dense(g, shape, dtype, device) for g in chosen]


_is_none = functools.partial(operator.is_, None)


neuron_forward.register_autograd(_backward, setup_context=_setup_context)

# The ops' kernels for CPU and CUDA tensors, registered with the dispatcher directly: `custom_op` registers its
# function behind a wrapper that turns Dynamo off and checks output aliasing on every call, host time that a
# compiled model pays per neuron call (these ops' outputs are always new tensors). The schema, fake kernels and
# autograd stay `custom_op`'s.
_KERNELS = torch.library.Library("autocuda", "IMPL")
for _key in ("CPU", "CUDA"):
    _KERNELS.impl("neuron_forward", _forward_impl, _key)
    _KERNELS.impl("neuron_backward", _backward_impl, _key)


# -- eager ----------------------------------------------------------------------------------------------------
def differentiable_once(backward):
    """Like torch's `once_differentiable`, which guards only when the incoming gradients require grad: with
    `create_graph=True` the gradients these kernels return depend on inputs that require grad (x, learnable
    parameters) even when the incoming ones do not, and a second derivative taken through them must raise
    rather than silently miss its terms."""
    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        if not torch.is_grad_enabled():  # the usual backward: no graph of the backward is recorded anyway
            return backward(ctx, *grads)
        with torch.no_grad():
            outputs = backward(ctx, *grads)
        if not any(ctx.needs_input_grad):  # create_graph=True, but nothing to differentiate again
            return outputs
        fail = torch._C._functions.DelayedError(
            b"autocuda kernels are differentiable once: a second derivative (double backward) through them is not "
            b"available; use backend='reference' for higher-order gradients", len(outputs))
        return fail(*(None if o is None else o.detach().requires_grad_() for o in outputs))
    return wrapper


class _Eager(torch.autograd.Function):
    """The same forward, backward and autograd wiring as the ops, without the custom-op dispatcher: in eager
    mode that dispatcher costs more host time per call than the kernels themselves on small layers."""

    @staticmethod
    def forward(ctx, form: ForwardForm, program: Any, initial: list[float], scalars: list[float],
                final_shape: Sequence[int] | None, x: Tensor, *tensors: Tensor):
        """`tensors`: the step inputs after x, the initial states (given as tensors), the tensor parameters;
        `final_shape`: as `ForwardForm.run` takes it; `program`: the call's (`run` runs its bound launch)."""
        n_more, n_states = form.n_more, 0 if initial else form.n_states
        more, states, tensor_params = tensors[:n_more], tensors[n_more:n_more + n_states], tensors[n_more + n_states:]
        outputs = run(form, program, x, states, initial, tensor_params, scalars, more, final_shape)
        _save_context(ctx, form, x, states, initial, tensor_params, scalars, outputs, more, program)
        # Outputs kept only for backward (h_seq, unrequested state sequences) get no gradient, and unused
        # gradients stay None instead of becoming zero tensors of the sequence's size (a full write each).
        ctx.set_materialize_grads(False)
        if form.hidden:
            ctx.mark_non_differentiable(*map(outputs.__getitem__, form.hidden))
        return tuple(outputs)

    @staticmethod
    @differentiable_once
    def backward(ctx, *grads):
        _, grad_x, grad_states, _, grad_params, _, _, _, _, more = _backward(ctx, grads, _backward_impl)
        return None, None, None, None, None, grad_x, *more, *grad_states, *grad_params


# `torch.autograd.Function.apply` less its Python wrapper, which outside functorch transforms only unwraps dead
# functorch wrappers among the arguments (done here for the tensors) before calling this: the wrapper is host time
# every small call pays.
_APPLY = super(torch.autograd.Function, _Eager).apply
_unwrap_if_dead = getattr(getattr(torch._C, "_functorch", None), "unwrap_if_dead", None)
_transforms_active = getattr(torch._C, "_are_functorch_transforms_active", None)


def forward(key: str, x: Tensor, states: list[Tensor], initial: list[float], tensor_params: list[Tensor],
            scalars: list[float], store_state_seq: bool, save_for_backward: bool, final_states: bool,
            more_inputs: Sequence[Tensor] = (), final_shape: Sequence[int] | None = None) -> list[Tensor]:
    """`autocuda::neuron_forward`: the op itself under torch.compile, its eager twin otherwise. `initial` and
    `scalars` are the caller's to give away: backward keeps them. `more_inputs`: the step inputs after x.
    `final_shape`: the neuron shape the final states are allocated in, in eager mode (the op gives them as [N]:
    callers view them as `program.neuron_shaped` does)."""
    if torch.compiler.is_compiling():
        return torch.ops.autocuda.neuron_forward(key, x, states, initial, tensor_params, scalars, store_state_seq,
                                                 save_for_backward, final_states, list(more_inputs))
    form = forward_form(key, x.dim() == 1, store_state_seq, save_for_backward, not initial, final_states)
    return forward_eager(form, x, states, initial, tensor_params, scalars, more_inputs, final_shape)


def forward_eager(form: ForwardForm, x: Tensor, states: list[Tensor], initial: list[float],
                  tensor_params: list[Tensor], scalars: Sequence[float], more_inputs: Sequence[Tensor] = (),
                  final_shape: Sequence[int] | None = None, program: Any = None) -> list[Tensor]:
    """`forward` in eager mode, for a caller that holds the call's form (`forward_form`) and, where it has one, its
    program (`autocuda.call.program`). The final states come out in `final_shape` where it is given (new tensors, not
    views: their holder can detach them in place)."""
    if not form.save:  # nothing to differentiate: no autograd node (the kernel's outputs are new tensors)
        return run(form, program, x, states, initial, tensor_params, scalars, more_inputs, final_shape)
    if len(more_inputs) != form.n_more:
        form._refuse_inputs(x, more_inputs)
    if _unwrap_if_dead is None or _transforms_active is None or _transforms_active():  # torch's own path
        return list(_Eager.apply(form, program, initial, scalars, final_shape, x, *more_inputs, *states,
                                 *tensor_params))
    return list(_APPLY(form, program, initial, scalars, final_shape,
                       *map(_unwrap_if_dead, (x, *more_inputs, *states, *tensor_params))))


def run(form: ForwardForm, program: Any, x: Tensor, states: Sequence[Tensor], initial: Sequence[float],
        tensor_params: Sequence[Tensor], scalars: Sequence[float], more_inputs: Sequence[Tensor],
        final_shape: Sequence[int] | None) -> list[Tensor]:
    """The forward kernel's outputs: the program's bound launch where it has one, else the form's."""
    launch = None if program is None else program.launch
    if launch is not None:
        return launch((x, *(states or initial), *tensor_params, *scalars), x, final_shape)
    return form.run(x, states, initial, tensor_params, scalars, more_inputs, final_shape)
