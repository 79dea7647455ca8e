"""The generated neuron kernels as PyTorch operators: `torch.library.custom_op`s with fake kernels and autograd, so
`opcheck`, `torch.compile(fullgraph=True)` and CUDA graphs see ordinary operators. Schemas are static, so one
family of ops serves every neuron; a string `key` names the layer configuration they run (`NeuronConfig.key`, the
same in every process; torch.compile guards on it as on any string constant):

    autocuda::neuron_forward(str key, Tensor x, Tensor[] states, float[] initial, Tensor[] tensor_params,
                             float[] scalars, bool store_state_seq, bool save_for_backward,
                             bool final_states, Tensor[] more_inputs) -> Tensor[]
    autocuda::neuron_backward(str key, Tensor grad_spike, Tensor[] grad_finals, Tensor[] grad_seqs,
                              Tensor[] saved, float[] initial, Tensor[] tensor_params, float[] scalars) -> Tensor[]
    autocuda::neuron_backward_part(str key, str gradients, Tensor grad_spike, Tensor[] grad_finals,
                                   Tensor[] saved, float[] initial, Tensor[] tensor_params, float[] scalars,
                                   Tensor[] correction) -> Tensor[]

x is [T, N] (multi-step) or [N] (single step); further step inputs, of x's shape, are `more_inputs`. The initial
states are either `states` ([N] tensors in x's dtype) or `initial` (one number each, no gradient); the other list is
empty. Tensor parameters are [N], [C] (per channel) or [1] in the compute dtype. Forward returns the kernel's outputs
in declaration order (`forward_outputs`); with final_states False it writes none and backward gets none of their
gradients. Backward takes a gradient for every final state or none ([]: the kernel starts from zero), and returns
grad of each step input, of each initial state given as a tensor, then each learnable parameter's partial sums
(`NeuronConfig.learnable`: one per neuron, per channel, or per group of `GRADIENT_GROUP` neurons for a shared one).
neuron_backward_part runs one pass of a BPTT in two (a fused BatchNorm's backward,
`nn.batchnorm_passes`): `gradients` "sums" (the per-channel sums alone) or "corrected" (the rest, the input's with
c1[c] * x + c0[c] added; `correction` = [c1, c0]). CUDA tensors run the NVRTC-compiled kernels on torch's current
stream, CPU tensors the same source through the host runner.
"""
from __future__ import annotations

import functools
import operator
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from ..base.errors import ConstantRangeError
from ..codegen.broadcast import CORRECTION_KEYS, gradient_groups
from ..runtime import configs, neuron_launch, tuning
from ..runtime.configs import compute_dtype, constant_result
from ..runtime.neuron_launch import KernelCall, NeuronConfig
from . import native
from .native.plan import Unplannable, launch_words

Tensor = torch.Tensor


def entry(key: str) -> NeuronConfig:
    """The configuration an op key names (`runtime.configs`), refused unless it runs kernels."""
    found = configs.config(key)
    if found.reference:
        raise KeyError(f"autocuda neuron key {key!r} names a configuration of the torch reference (no kernels)")
    return found


def _named_kernel(key: str, kind: str, **flags: bool) -> Any:
    """A kernel whose parameters' names (the same in every dtype) a form reads: float32's, which most calls run, else
    float64's where float32 cannot represent a constant of the equations (a float32 call is refused at its launch)."""
    try:
        return entry(key).kernel(kind, torch.float32, **flags)
    except ConstantRangeError:
        return entry(key).kernel(kind, torch.float64, **flags)


@functools.lru_cache(maxsize=1024)
def forward_outputs(key: str, single_step: bool, store_state_seq: bool, save: bool, final_states: bool = True
                    ) -> tuple[str, ...]:
    """Names of neuron_forward's outputs, in order."""
    kernel = _named_kernel(key, "step-forward" if single_step else "fptt", store_state_seq=store_state_seq,
                           save_for_backward=save, final_states=final_states)
    return tuple(n for n, p in kernel.cparams.items() if p.pointer and not p.const)


@functools.lru_cache(maxsize=1024)
def saved_names(key: str, single_step: bool, given_inits: bool = True) -> tuple[str, ...]:
    """What autograd saves: the backward kernel's inputs besides gradients and parameters (h_seq, x_seq, ...)."""
    e = entry(key)
    kernel = _named_kernel(key, "step-backward" if single_step else "bptt", given_inits=given_inits)
    skip = set(e.tensor_names) | set(e.op_scalars)
    return tuple(n for n, p in kernel.cparams.items()
                 if p.pointer and p.const and not n.startswith("grad_") and n not in skip)


def _check_counts(key: str, what: Sequence[str], expected: Sequence[int], got: Sequence[Sequence]) -> None:
    """Refuse the first of a call's argument lists (`got`, named by `what`) whose length is not `expected`'s."""
    for label, count, given in zip(what, expected, got):
        if len(given) != count:
            raise ValueError(f"autocuda.neuron_*: {entry(key).spec.name!r} takes {count} {label}, got {len(given)}")


class NativePlans(dict):
    """A form's native plans of one launch (`native.plan.launch_words`), by the class of a call's tensors (x's shape,
    dtype and device, every tensor's alignment): (plan number, output names), or None where none runs such calls.
    Made at such a call's first use outside a CUDA graph capture once the operator is loaded, used where
    `native.USE` holds for CUDA tensors (host ones where `native.HOST` asks): the op runs no Python launch."""

    LIMIT = 64  # plans kept; at the limit they are dropped: shapes that vary without end must not grow this

    def run(self, kernel: KernelCall, args: tuple, x: Tensor, others: list[Tensor], numbers: list[float], n: int,
            steps: int | None, backend: str) -> tuple[tuple[str, ...], list[Tensor]] | None:
        """(output names, outputs) of the call by its plan; None where none runs it (the Python launch does)."""
        if not native.USE or not (x.is_cuda or (native.HOST and x.is_cpu)):
            return None
        addresses = x.data_ptr()
        for other in others:
            addresses |= other.data_ptr()
        key = (x.shape, x.dtype, x.device, addresses & 15)
        # one lookup: between a test and a read another thread may clear the dict at its limit (`_make`)
        found = self.get(key, _UNMADE)
        if found is _UNMADE:
            found = self._make(key, kernel, args, x, others, len(numbers), n, steps, backend)
        if found is None:
            return None
        outputs = native.operator("op_call")(found[0], x, others, numbers)
        return (found[1], outputs) if outputs else None  # none: tensors the plan does not fit

    def _make(self, key: tuple, kernel: KernelCall, args: tuple, x: Tensor, others: list[Tensor], numbers: int,
              n: int, steps: int | None, backend: str) -> tuple[int, tuple[str, ...]] | None:
        if not native.loaded() or (x.is_cuda and torch.cuda.is_current_stream_capturing()):
            return None  # not kept: asked again at the next call
        launch = kernel.bound(args, x, n, steps, backend)
        try:
            words = launch_words(x, others, numbers, launch, steps is None)
            found: tuple[int, tuple[str, ...]] | None = (native.make_plan(words.words, words.dtypes),
                                                          launch.recipe.outputs)
        except Unplannable:
            found = None
        if len(self) >= self.LIMIT:
            self.clear()
        self[key] = found
        return found


_UNMADE: Any = object()  # `NativePlans.run`: no plan asked for yet (None: none runs such calls)


# -- the forms of a call, worked out once so that names, kernel options and argument order cost no per-call work --
class ForwardForm:
    """A neuron_forward call's kernel, op inputs by kernel name, outputs, and what autograd saves and returns."""

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
        if save:  # `hidden`: outputs only backward reads (h_seq, unasked state sequences); `picks`: what it reads
            shown = (self.spike_at, *self.finals, *self.seqs)
            self.hidden = tuple(i for i in range(len(self.outputs)) if i not in shown)
            inits = [f"{s}_init" for s in e.state_names] if given_inits else []
            available = (*e.input_keys, *inits, *self.outputs)
            self.picks = tuple(available.index(name) for name in saved_names(key, single, given_inits))
        # Per tensor parameter: its partial's index (None: not learnable), per neuron? (else [1]: partials summed)
        self.param_grads = tuple((e.learnable.index(name) if name in e.learnable else None, per_neuron)
                                 for name, per_neuron in e.tensors)
        self.plans = NativePlans()

    def run(self, x: Tensor, states: Sequence[Tensor], initial: Sequence[float], tensor_params: Sequence[Tensor],
            scalars: Sequence[float], more_inputs: Sequence[Tensor] = (), final_shape: Sequence[int] | None = None,
            planned: bool = False) -> list[Tensor]:
        """The kernel's `outputs`; final states shaped `final_shape` (the neuron shape) where given, else [N];
        `planned`: by the form's native plan where one runs the call (the op's implementation)."""
        chosen = states or initial
        if (len(chosen), len(tensor_params), len(scalars)) != self.counts or (states and initial):
            self._refuse(states, initial, tensor_params, scalars)
        shape = x.shape
        if len(more_inputs) != self.n_more or (more_inputs and any(u.shape != shape for u in more_inputs)):
            self._refuse_inputs(x, more_inputs)
        n, steps = shape[-1], (None if self.single else shape[0])
        args, backend = (x, *more_inputs, *chosen, *tensor_params, *scalars), "cuda" if x.is_cuda else "host"
        ran = self.plans.run(self.kernel, args, x, [*more_inputs, *states, *tensor_params], [*initial, *scalars], n,
                             steps, backend) if planned else None
        if ran is not None:  # (a call of no step has no plan)
            return ran[1]
        _, outputs = self.kernel(args, x, n, steps, backend, final_shape)
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
    """The form's `ForwardForm.positions`, `picks` (() unless saving) and learnable parameters in order."""
    form = forward_form(key, single, store_state_seq, save, given_inits, final_states)
    return form.positions, form.picks if save else (), entry(key).learnable


@functools.cache  # at most 32 per configuration (`runtime.configs`)
def forward_form(key: str, single: bool, store_state_seq: bool, save: bool, given_inits: bool,
                 final_states: bool = True) -> ForwardForm:
    return ForwardForm(key, single, store_state_seq, save, given_inits, final_states)


class _BackwardForm:
    """A neuron_backward call's kernel, op inputs by kernel name and `returns`; `gradients`: "all" or a pass's."""

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
        self.plans = NativePlans()

    def run(self, grad_spike: Tensor, grad_finals: Sequence[Tensor], grad_seqs: Sequence[Tensor],
            saved: Sequence[Tensor], initial: Sequence[float], tensor_params: Sequence[Tensor],
            scalars: Sequence[float], correction: Sequence[Tensor] = (), planned: bool = False) -> list[Tensor]:
        """Grads of step inputs, tensor initial states, learnable parameters (a pass's own); `correction`: c1, c0."""
        if (len(grad_finals), len(grad_seqs), len(saved), len(initial), len(tensor_params), len(scalars),
                len(correction)) != self.counts:  # `len` each: cheaper than a map over the lists
            _check_counts(self.key, _BACKWARD_LISTS, self.counts,
                          (grad_finals, grad_seqs, saved, initial, tensor_params, scalars, correction))
        args = (grad_spike, *grad_finals, *grad_seqs, *saved, *initial, *tensor_params, *scalars, *correction)
        shape = grad_spike.shape
        n, steps = shape[-1], (None if self.single else shape[0])
        backend = "cuda" if grad_spike.is_cuda else "host"
        ran = self.plans.run(self.kernel, args, grad_spike, [*grad_finals, *grad_seqs, *saved, *tensor_params,
                             *correction], [*initial, *scalars], n, steps, backend) if planned else None
        names, outputs = ran if ran is not None else self.kernel(args, grad_spike, n, steps, backend)
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


_OP_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _check_rows(op: str, name: str, x: Tensor) -> None:
    """Refuse an op's x (grad_spike) that is not [T, N] or [N] of a kernel dtype, naming it (the kernels' forms are
    chosen by its dims and dtype: a 0-dim one raised IndexError, an integer one an unnamed dtype error)."""
    if x.dim() not in (1, 2) or x.dtype not in _OP_DTYPES:
        raise ValueError(f"autocuda.{op}: {name}: expected a tensor of shape [T, N] or [N] (one step) of dtype "
                         f"float32, float64, float16 or bfloat16, got shape {tuple(x.shape)} of {x.dtype}")


# -- forward ----------------------------------------------------------------------------------------------
def _forward_impl(key: str, x: Tensor, states: list[Tensor], initial: list[float], tensor_params: list[Tensor],
                  scalars: list[float], store_state_seq: bool, save_for_backward: bool, final_states: bool,
                  more_inputs: list[Tensor]) -> list[Tensor]:
    _check_rows("neuron_forward", "x", x)
    form = forward_form(key, x.dim() == 1, store_state_seq, save_for_backward, not initial, final_states)
    return form.run(x, states, initial, tensor_params, scalars, more_inputs, planned=True)


neuron_forward = torch.library.custom_op("autocuda::neuron_forward", _forward_impl, mutates_args=())


@neuron_forward.register_fake
def _forward_fake(key, x, states, initial, tensor_params, scalars, store_state_seq, save_for_backward,
                  final_states, more_inputs):
    _check_rows("neuron_forward", "x", x)
    single, n = x.dim() == 1, x.shape[-1]
    steps = None if single else x.shape[0]
    flags = {"store_state_seq": store_state_seq, "save_for_backward": save_for_backward, "final_states": final_states}
    launched = "step-forward" if single else "fptt"
    kernel = entry(key).kernel(launched, x.dtype, **flags)
    outputs = [(neuron_launch.output_kind(name), p) for name, p in kernel.cparams.items() if p.pointer and not p.const]
    shapes = {"vector": (n,), "sequence": x.shape}
    if any(kind == "checkpoints" for kind, _ in outputs):  # multi-step: a row every so many steps of the segment
        # the call's shape runs (asked only here: the question fixes T, which torch.export may be told varies)
        every = entry(key).kernel(launched, x.dtype, **flags, **tuning.replay_option(n, steps)).checkpoint_steps
        shapes["checkpoints"] = (neuron_launch.checkpoint_rows(steps, every), n)
    return [x.new_empty(shapes[kind], dtype=p.torch_dtype) for kind, p in outputs]


# -- backward ---------------------------------------------------------------------------------------------
def _backward_impl(key: str, grad_spike: Tensor, grad_finals: list[Tensor], grad_seqs: list[Tensor],
                   saved: list[Tensor], initial: list[float], tensor_params: list[Tensor], scalars: list[float]
                   ) -> list[Tensor]:
    _check_rows("neuron_backward", "grad_spike", grad_spike)
    form = backward_form(key, grad_spike.dim() == 1, not initial, bool(grad_seqs), bool(grad_finals))
    return form.run(grad_spike, grad_finals, grad_seqs, saved, initial, tensor_params, scalars, planned=True)


neuron_backward = torch.library.custom_op("autocuda::neuron_backward", _backward_impl, mutates_args=())


@neuron_backward.register_fake
def _backward_fake(key, grad_spike, grad_finals, grad_seqs, saved, initial, tensor_params, scalars):
    _check_rows("neuron_backward", "grad_spike", grad_spike)
    form = backward_form(key, grad_spike.dim() == 1, not initial, bool(grad_seqs), bool(grad_finals))
    return _gradients_like(key, form.returns, grad_spike, tensor_params)


def _gradients_like(key: str, names: Sequence[str], grad_spike: Tensor, tensor_params: Sequence[Tensor]
                    ) -> list[Tensor]:
    """Fake kernels' gradients `names`: a step input's like grad_spike, others [N], or (channel sums) the
    parameter's shape, or (group sums) one per group of neurons."""
    e = entry(key)
    compute = compute_dtype(grad_spike.dtype)
    sizes: dict[str, Sequence[Any]] = {f"grad_{name}": value.shape
                                       for name, value in zip(e.tensor_names, tensor_params)}
    sizes |= {name: (gradient_groups(grad_spike.shape[-1]),) for name in e.group_sums}
    inputs = {f"grad_{k}" for k in e.input_keys}
    neurons = grad_spike.shape[-1:]
    return [grad_spike.new_empty(grad_spike.shape) if name in inputs
            else grad_spike.new_empty(neurons) if name.endswith("_init")
            else grad_spike.new_empty(sizes[name] if name in e.summed_outputs else neurons, dtype=compute)
            for name in names]


def _backward_part_impl(key: str, gradients: str, grad_spike: Tensor, grad_finals: list[Tensor], saved: list[Tensor],
                        initial: list[float], tensor_params: list[Tensor], scalars: list[float],
                        correction: list[Tensor]) -> list[Tensor]:
    """One pass of a two-pass BPTT (multi-step, no state sequence gradients): what `_BackwardForm.returns` names."""
    if gradients not in ("sums", "corrected"):
        raise ValueError(f"autocuda.neuron_backward_part: gradients 'sums' or 'corrected', got {gradients!r}")
    _check_rows("neuron_backward_part", "grad_spike", grad_spike)
    form = backward_form(key, False, not initial, False, bool(grad_finals), gradients)
    return form.run(grad_spike, grad_finals, (), saved, initial, tensor_params, scalars, correction, planned=True)


neuron_backward_part = torch.library.custom_op("autocuda::neuron_backward_part", _backward_part_impl,
                                               mutates_args=())


@neuron_backward_part.register_fake
def _backward_part_fake(key, gradients, grad_spike, grad_finals, saved, initial, tensor_params, scalars, correction):
    form = backward_form(key, False, not initial, False, bool(grad_finals), gradients)
    return _gradients_like(key, form.returns, grad_spike, tensor_params)


def backward_part(key: str, gradients: str, *args: Any) -> list[Tensor]:
    """`autocuda::neuron_backward_part`: the op under torch.compile, else its implementation."""
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
    """Keep on `ctx` the form, numbers, x's metadata, saved tensors (the kernel's, then parameters) and program."""
    ctx.form, ctx.outputs, ctx.program = form, form.outputs, program
    ctx.scalars, ctx.initial = scalars, initial
    ctx.meta = (x.shape, x.dtype, x.device)
    ctx.inputs = tuple(map(weakref.ref, (x, *more_inputs, *states)))  # (`_inputs_anchor`: no memory kept)
    if form.save:
        available = (x, *more_inputs, *states, *output)
        ctx.save_for_backward(*map(available.__getitem__, form.picks), *tensor_params)


def _backward(ctx, grads: list[Tensor], run_backward: Any = None):
    """The op's gradients from what `_save_context` kept, by `neuron_backward` or (eager twin) `run_backward`."""
    form: ForwardForm = ctx.form
    if not form.save:
        raise RuntimeError("autocuda.neuron_forward ran with save_for_backward=False; backward needs it True (a "
                           "program traced where nothing needed a gradient keeps it False: to train through a "
                           "torch.export program, export it with grad enabled and an input or a parameter of each "
                           "neuron layer requiring grad, as when training)")
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
    return (None, grad_inputs[0], list(grad_states), None if ctx.initial else [], grad_params,
            None if ctx.scalars else [], None, None, None, list(grad_inputs[1:]))


def _dense(grad: Tensor | None, shape, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Gradients reach backward as zeros, expanded views or None; the kernel reads contiguous ones."""
    if grad is None:
        return torch.zeros(shape, dtype=dtype, device=device)
    return grad.contiguous()


def _dense_all(grads: Sequence[Tensor | None], at: tuple[int, ...], shape, per_neuron: bool, dtype: torch.dtype,
               device: torch.device) -> list[Tensor]:
    """The gradients at `at`, dense; [] if none was given. `map` over C callables: this runs every backward."""
    chosen = list(map(grads.__getitem__, at))
    if all(map(_is_none, chosen)):
        return []
    shape = shape[-1:] if per_neuron else shape
    return [_dense(g, shape, dtype, device) for g in chosen]


_is_none = functools.partial(operator.is_, None)

neuron_forward.register_autograd(_backward, setup_context=_setup_context)

# CPU and CUDA kernels registered directly, not by `custom_op` (which keeps schema, fakes and autograd): its wrapper
# turns Dynamo off and checks output aliasing (outputs here are always new), host time every compiled neuron call.
_KERNELS = torch.library.Library("autocuda", "IMPL")
for _key in ("CPU", "CUDA"):
    _KERNELS.impl("neuron_forward", _forward_impl, _key)
    _KERNELS.impl("neuron_backward", _backward_impl, _key)


# -- eager ----------------------------------------------------------------------------------------------------
def differentiable_once(backward):
    """Torch's `once_differentiable` guards only when incoming gradients require grad, but under `create_graph=True`
    these kernels' gradients depend on x and learnable parameters: a double backward must raise, not miss terms."""
    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        if not torch.is_grad_enabled():  # the usual backward: no graph of the backward is recorded anyway
            return backward(ctx, *grads)
        with torch.no_grad():
            outputs = backward(ctx, *grads)
        if not any(ctx.needs_input_grad):  # create_graph=True, but nothing to differentiate again
            return outputs
        anchor = _inputs_anchor(ctx)
        fail = torch._C._functions.DelayedError(
            b"autocuda kernels are differentiable once: a second derivative (double backward) through them is not "
            b"available; use backend='reference' for higher-order gradients", len(outputs) + (anchor is not None))
        failing = fail(*(None if o is None else o.detach().requires_grad_() for o in outputs),
                       *(() if anchor is None else (anchor,)))
        return failing[:len(outputs)] if anchor is not None else failing
    return wrapper


def _inputs_anchor(ctx: Any) -> Tensor | None:
    """A zero that depends on the call's differentiable inputs still alive (those saved, and those `ctx.inputs`
    refers to weakly), or None. The failing node takes it as one more input, so that its outputs' history leads to
    the inputs: a second derivative toward them (`autograd.grad(g, x)`, which runs only nodes on a path to x) runs
    it and raises, where torch's `once_differentiable` leaves it off every path and misses its terms silently."""
    tensors = [t for t in ctx.saved_tensors if t is not None and t.requires_grad]
    tensors += [t for t in (ref() for ref in getattr(ctx, "inputs", ())) if t is not None and t.requires_grad]
    if not tensors:
        return None
    return torch.stack([t.reshape(-1)[:1].sum() for t in tensors]).sum() * 0


class _Eager(torch.autograd.Function):
    """The ops' eager twin: the custom-op dispatcher costs more host time per call than small layers' kernels."""

    @staticmethod
    def forward(ctx, form: ForwardForm, program: Any, initial: list[float], scalars: list[float],
                final_shape: Sequence[int] | None, x: Tensor, *tensors: Tensor):
        """`tensors`: the step inputs after x, the tensor initial states, the tensor parameters."""
        n_more, n_states = form.n_more, 0 if initial else form.n_states
        more, states, tensor_params = tensors[:n_more], tensors[n_more:n_more + n_states], tensors[n_more + n_states:]
        outputs = run(form, program, x, states, initial, tensor_params, scalars, more, final_shape)
        _save_context(ctx, form, x, states, initial, tensor_params, scalars, outputs, more, program)
        # Unused gradients stay None, not zero tensors (a full write each); outputs only backward reads get none.
        ctx.set_materialize_grads(False)
        if form.hidden:
            ctx.mark_non_differentiable(*map(outputs.__getitem__, form.hidden))
        return tuple(outputs)

    @staticmethod
    @differentiable_once
    def backward(ctx, *grads):
        _, grad_x, grad_states, _, grad_params, _, _, _, _, more = _backward(ctx, grads, _backward_impl)
        return None, None, None, None, None, grad_x, *more, *grad_states, *grad_params


# `Function.apply` less its Python wrapper, host time each small call pays: outside functorch transforms it only
# unwraps dead functorch wrappers among the arguments, which `forward_eager` does for the tensors.
_APPLY = super(torch.autograd.Function, _Eager).apply
_unwrap_if_dead = getattr(getattr(torch._C, "_functorch", None), "unwrap_if_dead", None)
# whether a torch.func transform (vmap, grad, ...) is active; None on a torch without the query
FUNCTORCH_QUERY: Any = getattr(torch._C, "_are_functorch_transforms_active", None)


def forward(key: str, x: Tensor, states: list[Tensor], initial: list[float], tensor_params: list[Tensor],
            scalars: list[float], store_state_seq: bool, save_for_backward: bool, final_states: bool,
            more_inputs: Sequence[Tensor] = (), final_shape: Sequence[int] | None = None) -> list[Tensor]:
    """`autocuda::neuron_forward`: the op under torch.compile, its eager twin otherwise. Backward keeps `initial` and
    `scalars`: leave them unchanged. `final_shape`: the eager final states' shape (the op's are [N])."""
    if torch.compiler.is_compiling():
        return torch.ops.autocuda.neuron_forward(key, x, states, initial, tensor_params, scalars, store_state_seq,
                                                 save_for_backward, final_states, list(more_inputs))
    form = forward_form(key, x.dim() == 1, store_state_seq, save_for_backward, not initial, final_states)
    return forward_eager(form, x, states, initial, tensor_params, scalars, more_inputs, final_shape)


def forward_eager(form: ForwardForm, x: Tensor, states: list[Tensor], initial: list[float],
                  tensor_params: list[Tensor], scalars: Sequence[float], more_inputs: Sequence[Tensor] = (),
                  final_shape: Sequence[int] | None = None, program: Any = None) -> list[Tensor]:
    """Eager `forward` with the form and optional program (`autocuda.call.program`); final states in `final_shape`
    are new tensors, not views, so their holder can detach them in place."""
    if not form.save:  # nothing to differentiate: no autograd node (the kernel's outputs are new tensors)
        return run(form, program, x, states, initial, tensor_params, scalars, more_inputs, final_shape)
    if len(more_inputs) != form.n_more:
        form._refuse_inputs(x, more_inputs)
    if _unwrap_if_dead is None or FUNCTORCH_QUERY is None or FUNCTORCH_QUERY():  # torch's own path
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
