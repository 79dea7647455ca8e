"""The generated neuron kernels as PyTorch operators: `torch.library.custom_op`s with fake (meta) kernels and
autograd, so `opcheck`, `torch.compile(fullgraph=True)` and CUDA graphs see an ordinary operator.

Schemas must be static, while neurons differ in states, parameters and saved tensors. So there is one small
family of two operators, and a string `key` names the neuron layer they run (a registered `NeuronConfig`):

    autocuda::neuron_forward(str key, Tensor x, Tensor[] states, float[] initial, Tensor[] tensor_params,
                             float[] scalars, bool store_state_seq, bool save_for_backward) -> Tensor[]
    autocuda::neuron_backward(str key, Tensor grad_spike, Tensor[] grad_finals, Tensor[] grad_seqs,
                              Tensor[] saved, float[] initial, Tensor[] tensor_params, float[] scalars)
                              -> Tensor[]

x is [T, N] (the multi-step kernels) or [N] (the single-step kernels); the initial states are either
`states`, [N] each in x's dtype, or `initial`, one number each for every neuron (the kernels then start from
it: no tensor to fill and read, and no gradient for it); the other list is empty. Tensor parameters are [N]
(one per neuron) or [1] (shared) in the compute dtype; scalars go to the kernel by value.
Forward returns the kernel's outputs in its declaration order (`forward_outputs`): spike_seq, h_seq (when
saving), state sequences (stored or saved), final states. Backward takes either a gradient for every final
state or none (grad_finals = []: a kernel that starts from zero, no zero tensors to fill), gradients of the
state sequences or none, and returns grad_x, the gradient of each initial state, then one per-neuron partial
sum per learnable parameter (`Entry.learnable`); with `initial` numbers, no gradients of initial states.

Keys are a readable spec name plus a digest of everything that selects the kernels, identical in every
process; torch.compile guards on them like on any string constant. CUDA tensors run the kernels through
CuPy on torch's current stream; CPU tensors run the same generated source through the host runner.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import torch

from .runtime import neuron as launch
from .runtime.cache import compute_dtype
from .runtime.neuron import NeuronConfig
from .spec.model import runtime_params

Tensor = torch.Tensor


@dataclasses.dataclass(frozen=True)
class Entry:
    """A registered neuron layer and the order of its op arguments."""

    config: NeuronConfig
    tensors: tuple[str, ...]     # names of Tensor[] tensor_params, in order
    scalars: tuple[str, ...]     # names of float[] scalars, in order
    learnable: tuple[str, ...]   # parameters whose per-neuron gradient partials backward returns, in order

    @property
    def states(self) -> tuple[str, ...]:
        return self.config.state_names


_REGISTRY: dict[str, Entry] = {}


def register(config: NeuronConfig) -> str:
    """Register a neuron layer (idempotent) and return the key its ops are called with."""
    key = config.key
    entry = _REGISTRY.get(key)
    if entry is None:
        tensors = tuple(name for name, _ in config.tensors)
        constants = dict(config.constants)
        scalars = tuple(n for n in runtime_params(config.spec, config.reset) if n not in constants and n not in tensors)
        learnable = tuple(p.name for p in config.spec.params if p.learnable and p.name not in constants)
        _REGISTRY[key] = Entry(config, tensors, scalars, learnable)
    elif entry.config != config:  # a digest collision: never run one neuron's kernels for another
        raise RuntimeError(f"autocuda op key {key!r} already names a different neuron configuration")
    return key


def entry(key: str) -> Entry:
    try:
        return _REGISTRY[key]
    except KeyError:
        raise KeyError(f"unknown autocuda neuron key {key!r}: build the layer (autocuda.functional / autocuda.nn) "
                       "in this process before calling its ops") from None


@functools.lru_cache(maxsize=1024)
def forward_outputs(key: str, single_step: bool, store_state_seq: bool, save: bool) -> tuple[str, ...]:
    """Names of neuron_forward's outputs, in order."""
    kind = "step-forward" if single_step else "fptt"
    kernel = entry(key).config.kernel(kind, torch.float32, store_state_seq=store_state_seq, save_for_backward=save)
    return tuple(n for n, p in kernel.cparams.items() if p.pointer and not p.const)


@functools.lru_cache(maxsize=1024)
def saved_names(key: str, single_step: bool, given_inits: bool = True) -> tuple[str, ...]:
    """What the backward kernel reads besides gradients and parameters: h_seq, x_seq (where `needs_x`),
    <state>_init/_seq (the initial states only when given as tensors). Autograd saves exactly these."""
    e = entry(key)
    kernel = e.config.kernel("step-backward" if single_step else "bptt", torch.float32, given_inits=given_inits)
    skip = set(e.tensors) | set(e.scalars)
    return tuple(n for n, p in kernel.cparams.items()
                 if p.pointer and p.const and not n.startswith("grad_") and n not in skip)


def _backend(t: Tensor) -> str:
    return "cuda" if t.device.type == "cuda" else "host"


def _params(e: Entry, tensor_params: Sequence[Tensor], scalars: Sequence[float]) -> dict:
    return {**dict(zip(e.tensors, tensor_params)), **dict(zip(e.scalars, scalars))}


def _initial(e: Entry, states: Sequence[Tensor], initial: Sequence[float]) -> dict:
    """The initial states by name: the tensors given, or else one number each."""
    if states and initial:
        raise ValueError("autocuda.neuron_forward: give the initial states as tensors or as numbers, not both")
    chosen = states or initial
    if len(chosen) != len(e.states):
        raise ValueError(f"autocuda.neuron_forward: {e.config.spec.name!r} has {len(e.states)} states "
                         f"({', '.join(e.states)}), got {len(chosen)} initial values")
    return dict(zip(e.states, chosen))


# -- forward ----------------------------------------------------------------------------------------------
@torch.library.custom_op("autocuda::neuron_forward", mutates_args=())
def neuron_forward(key: str, x: Tensor, states: list[Tensor], initial: list[float], tensor_params: list[Tensor],
                   scalars: list[float], store_state_seq: bool, save_for_backward: bool) -> list[Tensor]:
    return _forward_impl(key, x, states, initial, tensor_params, scalars, store_state_seq, save_for_backward)


def _forward_impl(key: str, x: Tensor, states: Sequence[Tensor], initial: Sequence[float],
                  tensor_params: Sequence[Tensor], scalars: Sequence[float], store_state_seq: bool,
                  save_for_backward: bool) -> list[Tensor]:
    e = entry(key)
    single = x.dim() == 1
    inits = _initial(e, states, initial)
    out = launch.forward(e.config, x, inits, _params(e, tensor_params, scalars), single_step=single,
                         store_state_seq=store_state_seq, save_for_backward=save_for_backward, backend=_backend(x))
    if not single and x.shape[0] == 0:  # no step ran: the final states are the initial ones
        for name, state in inits.items():
            if states:
                out[f"{name}_final"].copy_(state)
            else:
                out[f"{name}_final"].fill_(state)
    return list(out.values())  # the kernel's outputs in parameter order: `forward_outputs`


@neuron_forward.register_fake
def _forward_fake(key, x, states, initial, tensor_params, scalars, store_state_seq, save_for_backward):
    names = forward_outputs(key, x.dim() == 1, store_state_seq, save_for_backward)
    n = x.shape[-1]
    return [x.new_empty((n,)) if name.endswith("_final") else x.new_empty(x.shape) for name in names]


# -- backward ---------------------------------------------------------------------------------------------
@torch.library.custom_op("autocuda::neuron_backward", mutates_args=())
def neuron_backward(key: str, grad_spike: Tensor, grad_finals: list[Tensor], grad_seqs: list[Tensor],
                    saved: list[Tensor], initial: list[float], tensor_params: list[Tensor], scalars: list[float]
                    ) -> list[Tensor]:
    return _backward_impl(key, grad_spike, grad_finals, grad_seqs, saved, initial, tensor_params, scalars)


def _backward_impl(key: str, grad_spike: Tensor, grad_finals: Sequence[Tensor], grad_seqs: Sequence[Tensor],
                   saved: Sequence[Tensor], initial: Sequence[float], tensor_params: Sequence[Tensor],
                   scalars: Sequence[float]) -> list[Tensor]:
    e = entry(key)
    single = grad_spike.dim() == 1
    given = not initial
    grads = {"grad_spike_seq": grad_spike, **{f"grad_{s}_final": g for s, g in zip(e.states, grad_finals)},
             **{f"grad_{s}_seq": g for s, g in zip(e.states, grad_seqs)}}
    reads = {**dict(zip(saved_names(key, single, given), saved)),
             **{f"{s}_init": v for s, v in zip(e.states, initial)}}
    out = launch.backward(e.config, grads, reads, _params(e, tensor_params, scalars), single_step=single,
                          grad_state_seq=bool(grad_seqs), grad_finals=bool(grad_finals), given_inits=given,
                          backend=_backend(grad_spike))
    inits = [out[f"grad_{s}_init"] for s in e.states] if given else []
    partials = [out[f"grad_{p}"] for p in e.learnable]
    if not single and grad_spike.shape[0] == 0:  # no step ran: gradients pass straight through
        for i, init in enumerate(inits):
            if grad_finals:
                init.copy_(grad_finals[i])
            else:
                init.zero_()
        for partial in partials:
            partial.zero_()
    return [out["grad_x_seq"], *inits, *partials]


@neuron_backward.register_fake
def _backward_fake(key, grad_spike, grad_finals, grad_seqs, saved, initial, tensor_params, scalars):
    e = entry(key)
    n = grad_spike.shape[-1]
    compute = compute_dtype(grad_spike.dtype)
    inits = () if initial else e.states
    return [grad_spike.new_empty(grad_spike.shape), *[grad_spike.new_empty((n,)) for _ in inits],
            *[grad_spike.new_empty((n,), dtype=compute) for _ in e.learnable]]


# -- autograd -------------------------------------------------------------------------------------------------
def _setup_context(ctx, inputs, output) -> None:
    key, x, states, initial, tensor_params, scalars, store_state_seq, save = inputs
    single = x.dim() == 1
    ctx.key, ctx.scalars, ctx.single, ctx.saved_ok = key, list(scalars), single, save
    ctx.initial = list(initial)
    ctx.outputs = forward_outputs(key, single, store_state_seq, save)
    ctx.store_state_seq, ctx.meta = store_state_seq, (x.shape, x.dtype, x.device)
    if not save:
        return
    available = (x, *states, *output)
    picks = _saved_picks(key, single, store_state_seq, not initial)
    ctx.n_saved = len(picks)
    ctx.save_for_backward(*(available[i] for i in picks), *tensor_params)


@functools.lru_cache(maxsize=1024)
def _saved_only(key: str, single: bool, store_state_seq: bool) -> frozenset[str]:
    """Forward outputs that the caller never sees: what is written only for backward."""
    visible = {"spike_seq", *(f"{s}_final" for s in entry(key).states)}
    if store_state_seq:
        visible |= {f"{s}_seq" for s in entry(key).states}
    return frozenset(forward_outputs(key, single, store_state_seq, True)) - visible


@functools.lru_cache(maxsize=1024)
def _saved_picks(key: str, single: bool, store_state_seq: bool, given_inits: bool) -> tuple[int, ...]:
    """Where each of `saved_names` stands among (x, *initial states given as tensors, *forward outputs)."""
    inits = [f"{s}_init" for s in entry(key).states] if given_inits else []
    available = ("x_seq", *inits, *forward_outputs(key, single, store_state_seq, True))
    return tuple(available.index(n) for n in saved_names(key, single, given_inits))


def _backward(ctx, grads: list[Tensor], run_backward=None):
    if not ctx.saved_ok:
        raise RuntimeError("autocuda.neuron_forward ran with save_for_backward=False; backward needs it True")
    e = entry(ctx.key)
    by_name = dict(zip(ctx.outputs, grads))
    saved = list(ctx.saved_tensors)
    saved, tensor_params = saved[:ctx.n_saved], saved[ctx.n_saved:]
    shape, dtype, device = ctx.meta
    final_grads = [by_name[f"{s}_final"] for s in e.states]  # none given: a kernel that takes them as zero
    finals = [_dense(g, shape[-1:], dtype, device) for g in final_grads] if any(
        g is not None for g in final_grads) else []
    seq_grads = [by_name[f"{s}_seq"] for s in e.states] if ctx.store_state_seq else []
    seqs = [_dense(g, shape, dtype, device) for g in seq_grads] if any(g is not None for g in seq_grads) else []
    grad_spike = _dense(by_name["spike_seq"], shape, dtype, device)
    out = (run_backward or neuron_backward)(ctx.key, grad_spike, finals, seqs, saved, ctx.initial, tensor_params,
                                            ctx.scalars)
    n_inits = 0 if ctx.initial else len(e.states)
    grad_x, grad_states, partials = out[0], out[1:1 + n_inits], out[1 + n_inits:]
    partial = dict(zip(e.learnable, partials))
    grad_params = []
    for name, per_neuron in e.config.tensors:
        if name not in partial:
            grad_params.append(None)
        else:  # a shared parameter ([1]) gets the sum over neurons; torch's sum is deterministic
            grad_params.append(partial[name] if per_neuron else partial[name].sum(0, keepdim=True))
    # float[] arguments get None, except an empty one: torch matches it as an empty list of gradients
    return None, grad_x, list(grad_states), None if ctx.initial else [], grad_params, None, None, None


def _dense(grad: Tensor | None, shape, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Gradients reach backward as zeros, expanded views or None; the kernel reads contiguous ones."""
    if grad is None:
        return torch.zeros(shape, dtype=dtype, device=device)
    return grad.contiguous()


neuron_forward.register_autograd(_backward, setup_context=_setup_context)


# -- eager ----------------------------------------------------------------------------------------------------
def _differentiable_once(backward):
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

        def aliased(value):
            if value is None:
                return None
            value = value.detach()
            value.requires_grad = True
            return value
        return fail(*(aliased(o) for o in outputs))
    return wrapper


class _Eager(torch.autograd.Function):
    """The same forward, backward and autograd wiring as the ops, without the custom-op dispatcher: in eager
    mode that dispatcher costs more host time per call than the kernels themselves on small layers."""

    @staticmethod
    def forward(ctx, key, store_state_seq, save, scalars, initial, n_states, x, *tensors):
        states, tensor_params = list(tensors[:n_states]), list(tensors[n_states:])
        outputs = _forward_impl(key, x, states, initial, tensor_params, scalars, store_state_seq, save)
        _setup_context(ctx, (key, x, states, initial, tensor_params, scalars, store_state_seq, save), outputs)
        ctx.n_states = n_states
        # Outputs kept only for backward (h_seq, unrequested state sequences) get no gradient, and unused
        # gradients stay None instead of becoming zero tensors of the sequence's size (a full write each).
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(*(o for name, o in zip(ctx.outputs, outputs) if name in _saved_only(
            key, x.dim() == 1, store_state_seq)))
        return tuple(outputs)

    @staticmethod
    @_differentiable_once
    def backward(ctx, *grads):
        _, grad_x, grad_states, _, grad_params, *_ = _backward(ctx, list(grads), run_backward=_backward_impl)
        return None, None, None, None, None, None, grad_x, *grad_states, *grad_params


def forward(key: str, x: Tensor, states: list[Tensor], initial: list[float], tensor_params: list[Tensor],
            scalars: list[float], store_state_seq: bool, save_for_backward: bool) -> list[Tensor]:
    """`autocuda::neuron_forward`: the op itself under torch.compile, its eager twin otherwise."""
    if torch.compiler.is_compiling():
        return torch.ops.autocuda.neuron_forward(key, x, states, initial, tensor_params, scalars, store_state_seq,
                                                 save_for_backward)
    if not save_for_backward:  # nothing to differentiate: no autograd node (the kernel's outputs are new tensors)
        return _forward_impl(key, x, states, initial, tensor_params, scalars, store_state_seq, False)
    return list(_Eager.apply(key, store_state_seq, True, scalars, initial, len(states), x, *states, *tensor_params))
