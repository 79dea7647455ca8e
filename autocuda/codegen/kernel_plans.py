"""The plans of the four neuron kernels: what forward (FPTT and its single step) and backward (BPTT and its single
step) load, compute and store, written in the builder's vocabulary. Tensor names are the op layer's interface
(`codegen.neuron_kernel`)."""
from __future__ import annotations

import dataclasses
import functools
import re

import sympy as sp

from ..spec.derive import (
    EVENT,
    THRESHOLD,
    Derivation,
    H,
    adjoint_symbol,
    fire_step,
    level_gradient_symbol,
    previous_membrane,
    spike_levels,
    spike_value,
)
from ..toolchain.cnames import c_name, input_key, input_register
from .broadcast import CORRECTION_KEYS, PARAM_INDEX, PER_CHANNEL
from .builder import H_PREVIOUS, Builder
from .dtypes import fill
from .options import KernelOptions, KernelPlan, Transfer, replay_steps

SURROGATE_INPUT = sp.Symbol("z", real=True)   # the variable of a surrogate gradient expression
_H_STORED = sp.Symbol("ac_h_stored", real=True)


def forward_plan(derivation: Derivation, options: KernelOptions) -> KernelPlan:
    """FPTT or its single step: charge, fire, reset and update the states; store the spikes and what backward
    reads (h, the saved states or their checkpoints), and the final states."""
    b = Builder(derivation, options)
    system, step = derivation.system, derivation.forward
    saving = options.save_for_backward
    keeps_h = saving and not (derivation.charge_replayed and options.multi_step)
    pointers = [b.pointer(input_key(u.name), const=True) for u in system.inputs]
    b.register(*(input_register(u.name) for u in system.inputs), *(c_name(s.name) for s in system.states),
               "ac_out_spike")
    for u, pointer in zip(system.inputs, pointers):
        b.plan.loads.append(b.load(input_register(u.name), pointer, "ac_row", f"input {u.name}[t]"))
    for s in system.states:
        b.plan.setup.append(b.initial(c_name(s.name), s.name))
    b.params_setup()
    b.draws()
    b.pointer("spike_seq", const=False)
    if keeps_h:
        b.pointer("h_seq", const=False)
        b.register("ac_out_h")
    charge, threshold = b.emit([step.charge, step.threshold], comment="charge and threshold")
    b.statement("ac_h", charge)
    b.statement("ac_thr", threshold)
    b.statement("ac_s", spike_value(system), comment="fire")
    if any(e.has(EVENT) for e in step.new_states):
        b.statement("ac_e", spike_value(system, magnitude=True), comment="the hard reset's event")
    news = b.emit(list(step.new_states), comment="reset and state updates")
    for s, value in zip(system.states, news):
        b.statement(c_name(s.name, "next"), value)
    for s in system.states:
        b.statement(f"{c_name(s.name)}[lane]", c_name(s.name, "next"), declare=False)
    if system.output is None:
        b.statement("ac_out_spike[lane]", "ac_s", declare=False)
        b.plan.stores.append(b.store("spike_seq", "ac_row", "ac_out_spike", "spike s[t]"))
    else:  # the states' registers hold their values after the step, which the output reads
        if saving:
            raise ValueError("a spec that writes its output in place of the spike has no backward: its forward "
                             "kernels run with save_for_backward=False only")
        (written,) = b.emit([system.output], comment="the layer's output, written in place of the spike")
        b.statement("ac_out_spike[lane]", written, declare=False)
        b.plan.stores.append(b.store("spike_seq", "ac_row", "ac_out_spike", "the layer's output at t"))
    segment = replay_steps(derivation, options)
    if keeps_h:
        if b.storage is not b.compute:  # backward decides the spike again from h as stored: as forward did
            h_stored_as_decided(b)
        else:
            b.statement("ac_out_h[lane]", "ac_h", declare=False)
        b.plan.stores.append(b.store("h_seq", "ac_row", "ac_out_h", "h[t], saved for backward"))
    for s, saved in zip(system.states, derivation.saved_states):
        if options.store_state_seq or (saved and saving and not segment):
            pointer = b.pointer(f"{s.name}_seq", const=False)
            b.plan.stores.append(b.store(pointer, "ac_row", c_name(s.name), f"{s.name}[t] after reset"))
        if saved and saving and segment:  # backward replays the steps in between
            exact = segment > 1 or derivation.charge_replayed  # a replay starts from the value forward had
            pointer = b.pointer(f"{s.name}_checkpoints", const=False, compute_type=exact)
            store = b.store(pointer, "ac_row" if segment == 1 else f"t / {segment} * N + ac_n0",
                            c_name(s.name), f"{s.name}[t] after reset: a checkpoint", compute_type=exact)
            # none after the last step: backward starts each segment from the one before it (the first from the
            # initial state), never from the final states
            every = f"t % {segment} == {segment - 1} && " if segment > 1 else ""
            b.plan.stores.append(dataclasses.replace(store, guard=f"{every}t + 1 < T"))
    for s in system.states if options.final_states else ():
        pointer = b.pointer(f"{s.name}_final", const=False)
        b.plan.finish.append(b.store(pointer, "ac_n0", c_name(s.name), f"final {s.name}"))
    b.scalar_params()
    return b.done()


def h_stored_as_decided(b: Builder) -> None:
    """h for h_seq, rounded to the storage toward the side of the threshold forward's spike was decided on:
    to nearest, unless that crosses the threshold, then up (a spike) or down (none). Within one unit of the
    storage's last place of h either way, and a backward (or a replay) that compares it with the same threshold
    decides the same spike (rounded to nearest, h = 1 - 2^-9 in bfloat16 would be 1.0: a spike forward never
    fired, and the reset's gradient)."""
    storage = b.storage
    load = storage.element_load

    def stored(rounding: str) -> str:
        return fill(load, x=fill(rounding, x="ac_h"))
    b.printer.names[_H_STORED] = "ac_h_stored"
    b.statement("ac_h_stored", stored(storage.element_store), comment="h as stored, rounded to nearest")
    b.statement("ac_s_stored", fire_step(b.d.system, _H_STORED - THRESHOLD))
    b.statement("ac_out_h[lane]", "ac_h", declare=False, guard="ac_s_stored == ac_s",
                otherwise=f"(ac_s != {b.compute.literal(0)}) ? {stored(storage.element_store_up)} : "
                          f"{stored(storage.element_store_down)}",
                comment="unless that decides the spike otherwise: then rounded toward the side h was on")


def backward_plan(derivation: Derivation, options: KernelOptions, surrogate_gradient: sp.Expr) -> KernelPlan:
    """BPTT or its single step: threshold, spike and surrogate gradient recomputed from h, then the adjoint of one
    step; store the gradient of x, and those of the initial states and of the learnable parameters."""
    if derivation.system.output is not None:
        raise ValueError("a spec that writes its output in place of the spike has no backward kernel")
    b = Builder(derivation, options)
    system, step = derivation.system, derivation.backward
    corrected = options.gradients == "corrected"
    # the step inputs the reverse pass reads: the adjoint's, and x where its gradient gets the per-channel term
    reads = tuple(needed or (corrected and i == 0) for i, needed in enumerate(step.needs_inputs))
    b.pointer("grad_spike_seq", const=True)
    outs = [_grad_register(u.name) for u in system.inputs]
    b.register("ac_grad_s", "ac_h_cur", *outs)
    b.plan.loads.append(b.load("ac_grad_s", "grad_spike_seq", "ac_row", "gradient of s[t]"))
    for s in system.states:
        grad = c_name(s.name, "grad")
        b.register(grad)
        if options.grad_finals:
            pointer = b.pointer(f"grad_{s.name}_final", const=True)
            b.plan.setup.append(b.load(grad, pointer, "ac_n0", f"gradient of final {s.name}"))
        else:  # no loss term on the final states: the caller passes no zero tensors
            b.plan.setup.append(Transfer(f"gradient of final {s.name}: none", grad, "", "",
                                         b.compute.literal(0), vectorizable=False))
        if options.grad_state_seq:
            pointer = b.pointer(f"grad_{s.name}_seq", const=True)
            b.plan.loads.append(b.load(grad, pointer, "ac_row", f"gradient of {s.name}[t]", accumulate=True))
    replayed = derivation.charge_replayed and b.multi  # h too is replayed, from x: no h_seq
    if not replayed:
        b.pointer("h_seq", const=True)
    carry_h = derivation.recompute_membrane and b.multi
    segment = replay_steps(derivation, options)
    # one step without a replayed charge: the saved sequence's loop, read at t-1
    b.plan.segment = segment if segment > 1 or replayed else 0
    if carry_h:  # h[t-1] is loaded anyway to recompute v[t-1]; it becomes the next step's h[t]
        b.plan.setup.append(b.load("ac_h_cur", "h_seq", "(T - 1) * N + ac_n0", "h[T-1]"))
    elif b.plan.segment:  # loaded (or computed) by the replay, kept for the reverse pass
        b.plan.histories.append("ac_hist_h")
        if not replayed:
            b.plan.replay_loads.append(b.load("ac_h_cur", "h_seq", "ac_row", "h[t]"))
        b.plan.loads.append(_recall("ac_h_cur", "ac_hist_h", "h[t], from the replay"))
    else:
        b.plan.loads.append(b.load("ac_h_cur", "h_seq", "ac_row", "h[t]"))
    _previous_states(b, derivation, "_checkpoints" if segment else "_seq")
    for u, needed in zip(system.inputs, reads):
        if needed or replayed:
            pointer = b.pointer(input_key(u.name), const=True)
            b.register(input_register(u.name))
            load = b.load(input_register(u.name), pointer, "ac_row", f"input {u.name}[t]")
            if not replayed:
                b.plan.loads.append(load)
                continue
            b.plan.replay_loads.append(load)
            if needed:  # kept by the replay for the reverse pass: x is read once
                b.plan.histories.append(c_name(u.name, "hist"))
                b.plan.loads.append(_recall(input_register(u.name), c_name(u.name, "hist"),
                                            f"input {u.name}[t], from the replay"))
    b.params_setup()
    if corrected:
        _correction_setup(b)
    if replayed:
        _replay_charge(b, derivation, reads)
    elif segment:
        _replay(b, derivation)
    b.draws()
    b.statement("ac_h", "ac_h_cur[lane]", comment="recompute threshold, spike and surrogate gradient")
    b.statement("ac_thr", system.threshold)
    b.statement("ac_s", spike_value(system))
    if any(e.has(EVENT) for e in (*step.grad_inputs, *step.grad_states, *step.grad_params)):
        b.statement("ac_e", spike_value(system, magnitude=True))
    for k, level in enumerate(spike_levels(system)):  # a level's own surrogate, else the kernel's
        gradient = surrogate_gradient if level.surrogate is None else level.surrogate.gradient(SURROGATE_INPUT)
        b.statement(level_gradient_symbol(k).name, _substituted(gradient, SURROGATE_INPUT, level.argument))
    input_grads = (step.grad_inputs[0] + _SCALE * system.x + _SHIFT, *step.grad_inputs[1:]) if corrected \
        else step.grad_inputs
    outputs = _adjoint_of_one_step(b, derivation, options, [*input_grads, *step.grad_states, *step.grad_params])
    count = len(outs)
    grad_inputs, grad_states = outputs[:count], outputs[count:count + len(system.states)]
    grad_params = outputs[count + len(system.states):]
    for out, value in zip(outs, grad_inputs):
        b.statement(f"{out}[lane]", value, declare=False)
    for s, value in zip(system.states, grad_states):
        b.statement(c_name(s.name, "grad_prev"), value)
    stored = [(p, value) for p, value in zip(system.learnable, grad_params) if _stores_gradient(b, p)]
    # A parameter's term reads λ = d loss / d (the step's new states): it is summed before the registers of λ
    # take the previous step's values (in that order only where a term reads one, as an update's parameter does)
    adjoints = re.compile("|".join(rf"(?<!\w){re.escape(c_name(s.name, 'grad'))}\[lane\]" for s in system.states))
    early = any(adjoints.search(value) for _, value in stored)
    if early:
        _sum_param_gradients(b, stored)
    for s in system.states:
        b.statement(f"{c_name(s.name, 'grad')}[lane]", c_name(s.name, "grad_prev"), declare=False)
    if not early:
        _sum_param_gradients(b, stored)
    if carry_h:
        b.statement("ac_h_cur[lane]", "ac_h_prev[lane]", declare=False)
    sums = options.gradients == "sums"
    for u, out in zip(system.inputs, () if sums else outs):
        pointer = b.pointer(f"grad_{input_key(u.name)}", const=False)
        b.plan.stores.append(b.store(pointer, "ac_row", out, f"gradient of {u.name}[t]"))
    # a number given for all neurons has no gradient
    for s in system.states if options.given_inits and not sums else ():
        pointer = b.pointer(f"grad_{s.name}_init", const=False)
        b.plan.finish.append(b.store(pointer, "ac_n0", c_name(s.name, "grad"), f"gradient of {s.name}[-1]"))
    for p, _ in stored:
        b.plan.finish.append(b.param_gradient(p, c_name(p.name, "acc")))
    b.scalar_params()
    return b.done()


def _adjoint_of_one_step(b: Builder, derivation: Derivation, options: KernelOptions, exprs: list[sp.Expr]
                         ) -> list[str]:
    """The printed adjoint of one step, less the terms of a λ that autograd's graph holds no path to (0 times a NaN or
    inf partial would be NaN): every λ at the last step where the kernel takes no gradient of the final states nor of
    the state sequences (a single step is the last), and before the last step of a multi-step BPTT, the λ of a state
    that no step reads (a recorded value, say) unless its sequence's gradient is given."""
    step, states = derivation.backward, derivation.system.states
    seqs = options.grad_state_seq
    unread = {adjoint_symbol(s): sp.Integer(0) for s, grad in zip(states, step.grad_states)
              if grad == 0} if b.multi and not seqs else {}
    finals_free = dict.fromkeys(map(adjoint_symbol, states), sp.Integer(0))
    # xreplace, not subs: symbols for numbers alike, but subs compares every node of a long step with each symbol
    last = [expr.xreplace(finals_free) for expr in exprs] if not options.grad_finals and not seqs else exprs
    if not b.multi:
        return b.emit(last, comment="adjoint of one step")
    earlier = [expr.xreplace(unread) for expr in exprs] if unread else exprs
    if last == earlier:
        return b.emit(last, comment="adjoint of one step")
    printed = b.emit([*last, *earlier], comment="adjoint of one step (the last; the steps before it)")
    values = []
    for i, (final, before) in enumerate(zip(printed, printed[len(exprs):])):
        if final != before:
            b.statement(f"ac_adj{i}", final, guard="t == T - 1", otherwise=before)
            final = f"ac_adj{i}"
        values.append(final)
    return values


@functools.lru_cache(maxsize=1024)
def _substituted(expr: sp.Expr, old: sp.Symbol, new: sp.Expr) -> sp.Expr:
    """expr.subs(old, new), cached: every backward kernel of a derivation substitutes its levels' arguments into the
    surrogate gradient."""
    return expr.subs(old, new)


def _sum_param_gradients(b: Builder, stored: list[tuple[sp.Symbol, str]]) -> None:
    """Add each learnable parameter's term of this step to its sum (a register set to 0 before the loop)."""
    for p, value in stored:
        acc = c_name(p.name, "acc")
        b.register(acc)
        b.plan.setup.append(Transfer(f"sum of d loss / d {p.name}", acc, "", "", b.compute.literal(0),
                                     vectorizable=False))
        b.statement(f"{acc}[lane]", b.compute.op("add", f"{acc}[lane]", value), declare=False)


_SCALE, _SHIFT = sp.Symbol("ac_gx_scale", real=True), sp.Symbol("ac_gx_shift", real=True)  # c1 and c0


def _correction_setup(b: Builder) -> None:
    """c1 and c0 of the input gradient's per-channel term, loaded once per thread as the per-channel parameters
    are (`KernelOptions.gradients`)."""
    offset, per_lane = PARAM_INDEX[PER_CHANNEL]
    for key, symbol, what in zip(CORRECTION_KEYS, (_SCALE, _SHIFT), ("c1", "c0")):
        pointer, register = b.pointer(key, const=True, compute_type=True), symbol.name
        b.register(register)
        b.printer.names[symbol] = f"{register}[lane]"
        b.plan.setup.append(Transfer(f"{what} of the input gradient's per-channel term", register, pointer, offset,
                                     element=b.param_dtype.element, vectorizable=False, per_lane=per_lane,
                                     pair=b.storage.pair_floats))


def _stores_gradient(b: Builder, param: sp.Symbol) -> bool:
    """Whether this kernel stores the gradient of a learnable parameter: every one, or (`KernelOptions.gradients`)
    the per-channel sums alone, or all but them."""
    per_channel = b.tensor_params.get(param) == PER_CHANNEL
    return {"all": True, "sums": per_channel, "corrected": not per_channel}[b.o.gradients]


def _grad_register(name: str) -> str:
    """The register holding d loss / d (step input `name`) at t."""
    return "ac_out_grad_x" if name == "x" else c_name(name, "out_grad")


def _previous_states(b: Builder, derivation: Derivation, saved_as: str) -> None:
    """Registers holding each needed state of step t-1: loaded (from <state>`saved_as`), replayed, recomputed
    from h[t-1], or the initial value."""
    system = derivation.system
    replayed = derivation.charge_replayed and b.multi  # every state is replayed, needed or not
    for i, (s, needed) in enumerate(zip(system.states, derivation.backward.needs_states)):
        if not (needed or replayed):
            continue
        state, initial = c_name(s.name), c_name(s.name, "init")
        b.register(state, initial)
        b.plan.setup.append(b.initial(initial, s.name))
        if not b.multi:
            b.statement(f"{state}[lane]", f"{initial}[lane]", declare=False, comment=f"{s.name} before the step")
        elif i == 0 and derivation.recompute_membrane:
            b.register("ac_h_prev")
            b.plan.loads.append(b.load("ac_h_prev", "h_seq", "ac_row - N", "h[t-1]", otherwise=b.compute.literal(0)))
            b.statement(f"{state}[lane]", previous_membrane(system, H_PREVIOUS), declare=False,
                        comment=f"{s.name}[t-1] recomputed from h[t-1]", guard="t > 0", otherwise=f"{initial}[lane]")
        elif b.plan.segment:
            pointer, history = b.pointer(f"{s.name}_checkpoints", const=True, compute_type=True), c_name(s.name, "hist")
            checkpoint = b.load(state, pointer, f"(ac_s0 / {b.plan.segment} - 1) * N + ac_n0",
                                f"{s.name} before the segment: its checkpoint, or the initial value",
                                otherwise=f"{initial}[lane]", compute_type=True)
            b.plan.replay_setup.append(dataclasses.replace(checkpoint, guard="ac_s0 > 0", streamable=False))
            if needed:
                b.plan.histories.append(history)
                b.plan.loads.append(_recall(state, history, f"{s.name}[t-1], from the replay"))
        else:
            pointer = b.pointer(f"{s.name}{saved_as}", const=True)
            b.plan.loads.append(b.load(state, pointer, "ac_row - N", f"saved {s.name}[t-1]",
                                       otherwise=f"{initial}[lane]"))


def _recall(register: str, history: str, comment: str) -> Transfer:
    """register[lane] = its value at this step of the segment, kept by the replay."""
    return Transfer(comment, register, "", "", f"{history}[ac_k][lane]", vectorizable=False, streamable=False)


def _replay_charge(b: Builder, derivation: Derivation, reads: tuple[bool, ...]) -> None:
    """The replay's step where h is replayed too (`Derivation.charge_replayed`): forward's step again, printed as
    forward prints it, from the step's inputs and the states; what the reverse pass reads goes into the
    histories (the states before step t and the inputs it needs, and h[t])."""
    system, step, needs = derivation.system, derivation.forward, derivation.backward
    start = len(b.plan.body)
    kept = [s for s, needed in zip(system.states, needs.needs_states) if needed]
    kept += [u for u, needed in zip(system.inputs, reads) if needed]
    for symbol in kept:
        b.statement(f"{c_name(symbol.name, 'hist')}[ac_k][lane]", b.printer.names[symbol], declare=False,
                    comment="what the reverse pass reads" if symbol is kept[0] else "")
    charge, threshold = b.emit([step.charge, step.threshold], comment="charge and threshold, as forward")
    b.statement("ac_h", charge)
    b.statement("ac_thr", threshold)
    b.statement("ac_hist_h[ac_k][lane]", "ac_h", declare=False)
    b.statement("ac_s", spike_value(system))
    if any(e.has(EVENT) for e in step.new_states):
        b.statement("ac_e", spike_value(system, magnitude=True))
    news = b.emit(list(step.new_states), comment="reset and state updates, as forward")
    for s, value in zip(system.states, news):
        b.statement(c_name(s.name, "next"), value)
    for s in system.states:
        b.statement(f"{c_name(s.name)}[lane]", c_name(s.name, "next"), declare=False)
    b.plan.replay_body = b.plan.body[start:]
    del b.plan.body[start:]
    b.seal()  # forward's invariants, hoisted in forward's order: computed as forward computes them


def _replay(b: Builder, derivation: Derivation) -> None:
    """The replay's step (`KernelPlan`): the saved states before step t and h[t] into their histories, then the
    saved states' updates as forward ran them (the same expressions, printed alike: the replay rebuilds the
    values forward had, bit for bit, where the arithmetic is the storage's own)."""
    system = derivation.system
    kept = [(i, s) for i, (s, keep) in enumerate(zip(system.states, derivation.saved_states)) if keep]
    start = len(b.plan.body)
    for _, s in kept:
        b.statement(f"{c_name(s.name, 'hist')}[ac_k][lane]", f"{c_name(s.name)}[lane]", declare=False,
                    comment=f"{s.name}[t-1]" if s is kept[0][1] else "")
    b.statement("ac_hist_h[ac_k][lane]", "ac_h_cur[lane]", declare=False)
    b.statement("ac_h", "ac_h_cur[lane]", comment="threshold and spike, then the saved states' updates")
    b.statement("ac_thr", system.threshold)
    b.statement("ac_s", fire_step(system, H - THRESHOLD))
    news = b.emit([derivation.forward.new_states[i] for i, _ in kept])
    for (_, s), value in zip(kept, news):
        b.statement(c_name(s.name, "next"), value)
    for _, s in kept:
        b.statement(f"{c_name(s.name)}[lane]", c_name(s.name, "next"), declare=False)
    b.plan.replay_body = b.plan.body[start:]
    del b.plan.body[start:]
