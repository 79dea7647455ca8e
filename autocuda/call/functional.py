"""Functional API: run a neuron over a sequence (`multi_step`) or one step (`single_step`).

Where it runs (`backend`): "cuda" launches the generated kernels through the `autocuda::neuron_*` ops;
"host" runs the same ops on CPU tensors through the host runner (for tests); "reference" evaluates the step
with torch ops (differentiable by autograd; any device). The default is "cuda" for CUDA tensors when NVRTC can
be loaded, else "reference".

Everything that depends only on the layer's configuration (spec, reset, which parameters are tensors, ...) is
resolved once per process into a `NeuronConfig` (see `autocuda.runtime.configs`), outside what torch.compile
traces, so a compiled model sees shape checks, reshapes and one custom op per layer. In eager mode a call runs its
`Program` (`autocuda.call.program`: one per configuration and input class, built on the key's first call), which skips
the dispatcher and runs its bound launch or its native plan (calls of one step input).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils.checkpoint

from ..base.switches import check_switches
from ..codegen.noise import Seed, seed_source, step_values, using_generator
from ..runtime.configs import config, spec_facts, spec_ref
from ..spec.draws import system_draws
from ..spec.model import NeuronSpec
from . import program as programs_module
from .memory_order import memory_order
from .program import (
    FLOATS,
    PROGRAMS,
    SUPPORTED_DTYPES,
    Call,
    Program,
    Programs,
    as_rows,
    call_key,
    check_dense,
    forward_ad,
    neuron_shaped,
    tracing_state,
    transforms_active,
)

__all__ = ["multi_step", "single_step"]

Tensor = torch.Tensor


def multi_step(spec: NeuronSpec | str, x_seq: Tensor | Sequence[Tensor], *initial_states: Tensor | float,
               surrogate: Any = None, detach_reset: bool = False, reset: str | None = None,
               store_state_seq: bool = False, final_states: bool = True, backend: str | None = None,
               recompute: bool = False, save_h: bool = True, **params: Any
               ) -> tuple[Tensor, tuple[Tensor, ...] | None, tuple[Tensor, ...] | None]:
    """Run `spec` over x_seq [T, *]: (spike_seq [T, *], final states or None, state sequences [T, *] or None).

    A spec with several step inputs (`NeuronSpec.inputs`, e.g. g_e and g_i) takes them as a tuple in the spec's
    order, all of one shape, dtype and device: `multi_step("conductance_lif", (g_e_seq, g_i_seq))`; each gets
    its gradient.

    Initial states follow the spec's order (the membrane first), each a tensor of the neuron shape or one
    number for every neuron; missing ones start at the spec's initial values. When every initial state is a
    number the kernels start from it directly (no state tensor is filled or read; it gets no gradient).
    Parameters: floats (passed by value), tensors broadcastable to the neuron shape [*] (an
    `nn.Parameter`, or any tensor requiring grad, is learnable), defaults from the spec; `v_reset=None` means
    a soft reset. `reset` ('hard', 'soft', 'none') overrides the spec's reset rule. `final_states=False`
    returns None for the final states and the kernels do not write them (inference that starts every sequence
    afresh: one write per neuron and state less).

    `recompute=True` keeps only the call's arguments for backward, which runs this forward again first
    (`torch.utils.checkpoint`): what forward saves (h, T values per neuron) is not held from forward to backward,
    at the cost of a second forward. It saves memory where the input is kept anyway (a fused BatchNorm's input),
    or where torch.compile recomputes it from what is kept.

    `save_h=False` (the kernels' backends): forward saves no h for backward, only each state every few steps
    (`<state>_checkpoints`), and backward replays the steps in between from x, which it keeps instead of h
    (bitwise the values forward had). A training call then writes T values per neuron less, and backward reads x
    where it read h: fewer bytes where nothing else keeps what the layer is given (its input is kept anyway,
    as a fused BatchNorm's is), the same memory otherwise.
    """
    if _draws_under_compile(spec):
        return _eagerly(multi_step)(spec, x_seq, *initial_states, surrogate=surrogate, detach_reset=detach_reset,
                                    reset=reset, store_state_seq=store_state_seq, final_states=final_states,
                                    backend=backend, recompute=recompute, save_h=save_h, **params)
    check_switches(detach_reset=detach_reset, store_state_seq=store_state_seq, final_states=final_states,
                    save_h=save_h)
    if recompute is not False:
        if recompute is not True:
            raise TypeError(f"recompute: expected True or False, got {recompute!r}")
        if torch.is_grad_enabled():
            function = _replaying_draws(multi_step) if spec_facts(spec_ref(spec)).draws else multi_step
            return torch.utils.checkpoint.checkpoint(
                function, spec, x_seq, *initial_states, use_reentrant=False, preserve_rng_state=False,
                surrogate=surrogate, detach_reset=detach_reset, reset=reset, store_state_seq=store_state_seq,
                final_states=final_states, backend=backend, save_h=save_h, **params)
    return run_sequence(PROGRAMS, spec, x_seq, initial_states, surrogate, detach_reset, reset, store_state_seq,
                        final_states, backend, save_h, params)[0]


def _draws_under_compile(spec: NeuronSpec | str) -> bool:
    """Whether torch.compile traces a call whose step draws: each call takes a fresh seed from torch's generator
    (`noise.Seed`), which a trace would hold as one constant, so such calls run eagerly, outside the graph (a graph
    break; Dynamo compiles nothing inside them). torch.export has no eager part to run them in: refused by name (its
    non-strict trace recursed here without end, its strict one named only the disabled function)."""
    if not torch.compiler.is_compiling():
        return False
    facts = spec_facts(spec_ref(spec))
    if facts.draws and torch.compiler.is_exporting():
        raise NotImplementedError(
            f"neuron {facts.name!r}: its step draws random numbers (randn(), rand()) with a fresh seed each call, "
            f"which torch.export would keep as one constant of the program: a step that draws cannot be exported "
            f"(torch.compile runs such calls eagerly, outside its graph)")
    return facts.draws


def _replaying_draws(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function` taking its seed, in its first run and in the checkpoint's run in backward, from the state the seed
    source (`noise.seed_source`) has now, which then moves on as one call's draw moves it: the recomputation draws
    what the first run drew, and the next call draws afresh."""
    source = seed_source()
    state = source.get_state()
    Seed.from_torch(source)

    def replaying(*args: Any, **kwargs: Any) -> Any:
        generator = torch.Generator()
        generator.set_state(state)
        with using_generator(generator):
            return function(*args, **kwargs)
    return replaying


_EAGER: dict[Callable[..., Any], Callable[..., Any]] = {}


def _eagerly(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function` run outside torch.compile's graph (made on first use: torch._dynamo is loaded by then)."""
    eager = _EAGER.get(function)
    if eager is None:
        eager = _EAGER[function] = torch.compiler.disable(function)
    return eager


def run_sequence(programs: Programs, spec: NeuronSpec | str, x_seq: Tensor | Sequence[Tensor],
                 initial_states: Sequence[Tensor | float], surrogate: Any, detach_reset: bool, reset: str | None,
                 store_state_seq: bool, final_states: bool, backend: str | None, save_h: bool,
                 params: dict[str, Any]) -> tuple[tuple, tuple[Program, dict[str, Any]] | None]:
    """`multi_step`'s results (no recompute) through the programs of `programs` (a layer's own, or functional
    calls'), and, of a call that launched its program's kernels, that program and the parameters' values (else
    None). A call of a bound program's key runs it at once (`Program.run_bound`): no `Call` is built."""
    found = None  # the program of the call's key where it was looked up: `Call` need not work the key out again
    if type(x_seq) is Tensor and FLOATS.issuperset(map(type, initial_states)) and programs_module.ENABLED and not (
            torch.compiler.is_compiling() or transforms_active() or tracing_state() or forward_ad._current_level >= 0):
        options = (False, store_state_seq, final_states)
        try:
            program = programs.get(call_key(spec, x_seq, initial_states, surrogate, detach_reset, reset, backend,
                                            save_h, options, params))
        except (TypeError, RuntimeError):  # the checks below name the argument (a sparse x has no data pointer)
            program = None
        ran = None if program is None or program.launch is None else program.run_bound(x_seq, initial_states, params)
        found = program
        if ran is not None:
            sizes = x_seq.shape
            results = sequence_results(ran[0], program.bound_form.positions,  # type: ignore[union-attr]
                                       None if len(sizes) == 2 else tuple(sizes), tuple(sizes[1:]), final_states,
                                       store_state_seq)
            return results, (program, ran[1])  # type: ignore[return-value]
    inputs = _step_inputs(x_seq, "x_seq", 2)
    x_seq = inputs[0]
    if not x_seq.is_contiguous():
        order = memory_order(x_seq, 1, initial_states, params)
        if order is not None:  # channels_last and other dense layouts: run on the contiguous view, no copy
            spikes, kept, seqs = multi_step(spec, _one_or_all(order.inputs(inputs)), *order.states(initial_states),
                                            surrogate=surrogate, detach_reset=detach_reset, reset=reset,
                                            store_state_seq=store_state_seq, final_states=final_states,
                                            backend=backend, save_h=save_h, **order.params(params))
            return (order.sequence(spikes), None if kept is None else tuple(map(order.neuron, kept)),
                    None if seqs is None else tuple(map(order.sequence, seqs))), None
    shape = tuple(x_seq.shape)  # one tuple, sliced below: cheaper than slicing torch.Size
    call = Call(spec, x_seq, shape[1:], initial_states, surrogate, detach_reset, reset, backend, params,
                len(inputs), save_h, programs, (False, store_state_seq, final_states), found)
    steps = shape[0]
    if steps == 0:  # nothing to run: empty sequences, the final states are the initial ones
        seqs = tuple(x_seq.new_empty(x_seq.shape) for _ in call.states) if store_state_seq else None
        return (x_seq.new_empty(x_seq.shape), tuple(call.state_tensors()) if final_states else None, seqs), None
    if call.backend == "reference":
        return _reference_multi(call, inputs, store_state_seq, final_states), None
    flat = as_rows(x_seq, (steps, call.numel))
    more = [as_rows(u, (steps, call.numel)) for u in inputs[1:]]
    outputs, positions = call.launch(flat, False, store_state_seq, final_states, more)
    return sequence_results(outputs, positions, None if flat is x_seq else shape, call.shape, final_states,
                            store_state_seq), (call.program, call.values)


def sequence_results(outputs: Sequence[Tensor], positions: tuple, shape: tuple[int, ...] | None,
                     neuron_shape: tuple[int, ...], final_states: bool, store_state_seq: bool
                     ) -> tuple[Tensor, tuple[Tensor, ...] | None, tuple[Tensor, ...] | None]:
    """A multi-step call's (spikes, final states or None, state sequences or None) from the forward op's outputs and
    their positions (`ops.ForwardForm.positions`), in x's `shape` and the neuron shape (as [T, N] and [N] where
    `shape` is None)."""
    spike, finals, seqs = positions
    if shape is None:
        return (outputs[spike], tuple(map(outputs.__getitem__, finals)) if final_states else None,
                tuple(map(outputs.__getitem__, seqs)) if store_state_seq else None)
    return (outputs[spike].view(shape),
            tuple(neuron_shaped(outputs[i], neuron_shape) for i in finals) if final_states else None,
            tuple(outputs[i].view(shape) for i in seqs) if store_state_seq else None)


def single_step(spec: NeuronSpec | str, x: Tensor | Sequence[Tensor], *states: Tensor | float, surrogate: Any = None,
                detach_reset: bool = False, reset: str | None = None, backend: str | None = None, **params: Any
                ) -> tuple[Tensor, tuple[Tensor, ...]]:
    """One step of `spec` on x [*] from `states` (each [*]; missing ones start at the spec's initial values):
    (spike, new states). Arguments as in `multi_step` (several step inputs: a tuple of one tensor each)."""
    if _draws_under_compile(spec):
        return _eagerly(single_step)(spec, x, *states, surrogate=surrogate, detach_reset=detach_reset, reset=reset,
                                     backend=backend, **params)
    check_switches(detach_reset=detach_reset)
    return run_step(PROGRAMS, spec, x, states, surrogate, detach_reset, reset, backend, params)[0]



def run_step(programs: Programs, spec: NeuronSpec | str, x: Tensor | Sequence[Tensor],
             states: Sequence[Tensor | float], surrogate: Any, detach_reset: bool, reset: str | None,
             backend: str | None, params: dict[str, Any]
             ) -> tuple[tuple[Tensor, tuple[Tensor, ...]], tuple[Program, dict[str, Any]] | None]:
    """`single_step`'s results through the programs of `programs` (a layer's own, or functional calls'), and, of a
    call that launched its program's kernels, that program and the parameters' values (else None)."""
    inputs = _step_inputs(x, "x", 0)
    x = inputs[0]
    if not x.is_contiguous():
        order = memory_order(x, 0, states, params)
        if order is not None:  # channels_last and other dense layouts: run on the contiguous view, no copy
            spike, new_states = single_step(spec, _one_or_all(order.inputs(inputs)), *order.states(states),
                                            surrogate=surrogate, detach_reset=detach_reset, reset=reset,
                                            backend=backend, **order.params(params))
            return (order.sequence(spike), tuple(map(order.sequence, new_states))), None
    call = Call(spec, x, tuple(x.shape), states, surrogate, detach_reset, reset, backend, params, len(inputs),
                True, programs, (True, False, True))
    if call.backend == "reference":
        from ..runtime import reference as ref  # derives the step with sympy: imported only for this path

        system = config(call.key).reference_step[0]
        x_in, states_in, params, surrogate_in, detach = call.reference_args(inputs)
        seed = Seed.from_arguments(call.values)
        draws = system_draws(system) if seed is not None else ()  # (no sympy where torch.compile traces a call)
        drawn = step_values(draws, seed, 0, inputs[0]) if seed is not None and draws else None
        spike, new_states, _ = ref.step(system, x_in, states_in, params, surrogate_in, detach, drawn)
        return (spike.to(x.dtype), tuple(s.to(x.dtype) for s in new_states)), None
    flat = as_rows(x, (call.numel,))
    more = [as_rows(u, (call.numel,)) for u in inputs[1:]]
    outputs, (spike, finals, _) = call.launch(flat, True, False, True, more)
    ran = call.program, call.values
    if flat is x:  # x is [N] already: so are the outputs
        return (outputs[spike], tuple(map(outputs.__getitem__, finals))), ran
    shape = tuple(x.shape)
    return (outputs[spike].view(shape), tuple(neuron_shaped(outputs[i], shape) for i in finals)), ran


def _step_inputs(x: Any, name: str, min_dim: int) -> tuple[Tensor, ...]:
    """The step inputs of a call: x alone, or a tuple (list) of them, each checked, all of one shape, dtype and
    device."""
    if isinstance(x, torch.Tensor):
        _check_input(x, name, min_dim)
        return (x,)
    if not isinstance(x, (tuple, list)) or not x or not any(isinstance(u, torch.Tensor) for u in x):
        raise TypeError(f"{name}: expected a torch.Tensor, or a tuple of them (one per step input), got "
                        f"{'an empty ' if isinstance(x, (tuple, list)) and not x else ''}{type(x).__name__}")
    for i, u in enumerate(x):  # a tuple of tensors and something else: that element, not "got tuple"
        if not isinstance(u, torch.Tensor):
            raise TypeError(f"{name}[{i}]: expected a torch.Tensor (one per step input), got {type(u).__name__}")
    for i, u in enumerate(x):
        _check_input(u, f"{name}[{i}]", min_dim)
    first = x[0]
    for i, u in enumerate(x[1:], 1):
        if u.shape != first.shape or u.dtype != first.dtype or u.device != first.device:
            raise ValueError(f"{name}[{i}]: every step input must match the first in shape, dtype and device; got "
                             f"{tuple(u.shape)} {u.dtype} on {u.device} against {tuple(first.shape)} {first.dtype} "
                             f"on {first.device}")
    return tuple(x)


def _one_or_all(inputs: tuple[Tensor, ...]) -> Tensor | tuple[Tensor, ...]:
    """The step inputs as a call takes them: one tensor, or a tuple of several."""
    return inputs[0] if len(inputs) == 1 else inputs


def _check_input(x: Any, name: str, min_dim: int) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name}: expected a floating dtype (float32, float64, float16, bfloat16), got {x.dtype}")
    check_dense(name, x)
    if x.dim() < min_dim:
        raise ValueError(f"{name}: expected a tensor of shape [T, *] (at least {min_dim} dims), "
                         f"got shape {tuple(x.shape)}")


def _reference_multi(call: Call, inputs: Sequence[Tensor], store_state_seq: bool, final_states: bool):
    from ..runtime import reference as ref  # derives the step with sympy: imported only for this path

    x_seq = inputs[0]
    x, states, params, surrogate, detach = call.reference_args(inputs)
    spikes, finals, seqs = ref.multi_step(config(call.key).reference_step[0], x, states, params, surrogate, detach,
                                          Seed.from_arguments(call.values))
    dtype = x_seq.dtype
    kept = tuple(s.to(dtype) for s in finals) if final_states else None
    return spikes.to(dtype), kept, (tuple(s.to(dtype) for s in seqs) if store_state_seq else None)
