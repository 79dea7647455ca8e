"""A program's call as a native plan: the words `neuron_call.cpp` reads (`read_plan`, then `read_launch`). Each kernel
parameter's 8-byte slot holds a constant (N, T), an output, a call tensor or number (`NeuronConfig.op_inputs` order)."""
from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from ...base.errors import AutocudaError
from ...codegen.broadcast import gradient_groups
from ...runtime.neuron_launch import FINAL, BoundLaunch, checkpoint_rows
from ...toolchain import driver

CONSTANT, OUTPUT, TENSOR, NUMBER = range(4)  # a slot's source
RUNNERS = {"cuda": 1, "host": 2}
SLOT_TYPES = {"float": 0, "double": 1, "long long": 2, "int64_t": 2, "int": 3, "unsigned int": 4,  # C type -> slot
              "unsigned char": 5, "bool": 5}  # slot 0-5: float, double, int64, int32, uint32, one byte
POINTER = 2  # an address, 8 bytes
SINGLE = -1  # a single step's `steps`: x is the neuron shape, its sequences one value per neuron
FLAT = -3  # an output's rows: a flat output of the number of values that the next word gives


class Unplannable(AutocudaError):
    """A call whose launches a plan cannot express (never reaches a caller: the Python path runs the call)."""


class Words:
    """The words of one plan, with the dtypes its outputs name by index."""
    def __init__(self) -> None:
        self.words: list[int] = []
        self.dtypes: list[torch.dtype] = []

    def dtype(self, dtype: torch.dtype) -> int:
        if dtype not in self.dtypes:
            self.dtypes.append(dtype)
        return self.dtypes.index(dtype)

    def add(self, *values: int) -> None:
        self.words += [int(v) for v in values]


def add_launch(out: Words, bound: BoundLaunch, tensors: int, numbers: int) -> None:
    """One launch's words: runner, kernel, context, grid, block, the call's tensor count, the outputs, the slots."""
    recipe, binding, kernel = bound.recipe, bound.binding, bound.recipe.kernel
    if not bound.runs:
        raise Unplannable("a call of no neurons launches nothing")
    runner, function, context = _kernel_function(bound)
    out.add(runner, function, context, bound.grid[0], bound.block[0], tensors)
    rows: dict[str, tuple[int, ...]] = {"vector": (-1,), FINAL: (-2,), "groups": (FLAT, gradient_groups(bound.n)),
                                        "sequence": (-1 if bound.steps is None else bound.steps,)}
    if kernel.checkpoint_steps:
        rows["checkpoints"] = (checkpoint_rows(bound.steps or 0, kernel.checkpoint_steps),)
    out.add(len(recipe.allocations))
    for kind, dtype in recipe.allocations:  # rows -1: [N]; -2: a final state, neuron-shaped (`run`); FLAT, numel:
        if kind not in rows:                # [numel]; else [rows, N]
            raise Unplannable(f"{kind} outputs")
        out.add(*rows[kind], out.dtype(bound.like_dtype if dtype is None else dtype))
    outputs, inputs = len(recipe.outputs), len(binding.inputs)
    taken = sorted(at for at, _, _ in binding.inputs)  # the arguments that are tensors, by their place
    out.add(len(binding.order))
    for (_, name, _), at in zip(recipe.sources, binding.order):
        param = kernel.cparams[name]
        if at < 2:
            out.add(CONSTANT, bound.n if at == 0 else bound.steps or 0, SLOT_TYPES.get(param.ctype, POINTER))
        elif at < 2 + outputs:
            out.add(OUTPUT, at - 2, POINTER)
        elif at < 2 + outputs + inputs:
            given = taken.index(binding.inputs[at - 2 - outputs][0])
            if given >= tensors:
                raise Unplannable(f"input {name} is not among the call's tensors")
            out.add(TENSOR, given, POINTER)
        else:
            place = at - 2 - outputs - inputs  # among the arguments; less the tensors before it, among the numbers
            given = place - sum(1 for t in taken if t < place)
            if param.pointer or param.ctype not in SLOT_TYPES or not 0 <= given < numbers:
                raise Unplannable(f"scalar {name} of type {param.ctype}")
            out.add(NUMBER, given, SLOT_TYPES[param.ctype])


def _kernel_function(bound: BoundLaunch) -> tuple[int, int, int]:
    """(runner, kernel function address, context address) of a bound launch."""
    if bound.backend == "cuda":
        launcher = bound.launcher.launcher  # type: ignore[union-attr]
        return RUNNERS["cuda"], launcher.function, launcher.context
    from ...toolchain.host.runner import load_kernel
    kernel = bound.recipe.kernel
    host = load_kernel(kernel.full_codes, kernel.kernel_name, tuple(kernel.cparams.values()))
    return RUNNERS["host"], ctypes.cast(host.function, ctypes.c_void_p).value or 0, 0


def plan_words(x: torch.Tensor, others: Sequence[torch.Tensor], numbers: int, forward: BoundLaunch, form: Any,
               backward: BoundLaunch | None, backward_finals: BoundLaunch | None,
               grads: Sequence[tuple[str | None, bool]]) -> Words:
    """The plan of a call on x [T, N] (a single step's [N]), `others` (tensor initial states [N], tensor parameters [1])
    and `numbers` numbers (initial states, then scalars); `grads`, per input: (gradient output or None, summed)."""
    out = Words()
    neurons = x.shape[-1]
    steps = SINGLE if form.single else x.shape[0]  # form: an `ops.ForwardForm`
    trains = backward is not None  # backward(_finals): without (with) the final states' gradients
    addresses = x.data_ptr()
    for other in others:
        addresses |= other.data_ptr()
    out.add(steps, neurons, numbers, 1 + len(others), addresses & 15, out.dtype(x.dtype),
            x.get_device() if x.is_cuda else -1, trains, form.spike_at)
    params = len(form.config.tensor_names) if trains else 0
    first = 1 + len(others) - params  # the first tensor parameter's place
    picks = [at if at < first else at + params for at in form.picks] if trains else []  # outputs after tensor params
    saved = (*picks, *range(first, first + params)) if trains else ()  # backward's reads in (call's tensors, outputs)
    for positions in (form.finals, saved, form.hidden if trains else ()):
        out.add(len(positions), *positions)
    sizes = [word for other in others for word in (-1 if other.numel() == neurons else other.numel(),
                                                   out.dtype(other.dtype))]
    out.add(len(sizes), *sizes)
    for launch in (backward, backward_finals if form.finals else None):
        at = [-1 if name is None else launch.recipe.outputs.index(name) for name, _ in grads] \
            if launch is not None else []
        out.add(len(at), *at)
    sums = [int(summed) for _, summed in grads] if trains else []  # a gradient summed from partials
    out.add(len(sums), *sums)
    out.add(*(driver.function_addresses(driver.NATIVE_FUNCTIONS) if x.is_cuda else (0,) * 5))
    add_launch(out, forward, 1 + len(others), numbers)
    if backward is not None:
        add_launch(out, backward, 1 + len(saved), numbers)  # spikes' gradient, (finals' gradients,) saved tensors
        if form.finals:
            if backward_finals is None:
                raise Unplannable("no backward launch for the final states' gradients")
            add_launch(out, backward_finals, 1 + len(form.finals) + len(saved), numbers)
    return out


class _OneLaunch(NamedTuple):
    """What `plan_words` reads of a form, for a plan of one launch (`launch_words`)."""

    single: bool
    spike_at: int = 0
    finals: tuple[int, ...] = ()


def launch_words(x: torch.Tensor, others: Sequence[torch.Tensor], numbers: int, launch: BoundLaunch,
                 single: bool) -> Words:
    """The plan of one launch that records no autograd node (an op's implementation: `neuron_call.cpp`'s `op_call`)
    on x [T, N] (a single step's [N]) and `others`, its other tensors in its arguments' order, with `numbers`
    numbers; its outputs are the launch's, in their order."""
    return plan_words(x, others, numbers, launch, _OneLaunch(single), None, None, ())
