"""Spec -> kernels: the pipeline stages in order (system, derivation, rendering), cached per process.

Derivation is the slow step (sympy), so derivations are cached by everything they depend on; kernels are
cached by the derivation and the rendering options.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping
from typing import Any

from ..base.errors import ConstantRangeError, LiteralError
from ..base.switches import check_switches
from ..spec.budget import bounded, reuse
from ..spec.derive import Derivation, Reset, StepSystem, derive, replaying_charge
from ..spec.load import as_spec
from ..spec.model import NeuronSpec, tensor_param_names
from ..spec.surrogate import Surrogate, get_surrogate
from ..spec.system import step_system
from .broadcast import PER_CHANNEL, PER_NEURON, SHARED, Broadcast
from .dtypes import DType, get_dtype
from .layout import Layout
from .neuron_kernel import KERNELS, REPLAY_STEPS, SURROGATE_INPUT, KernelOptions, NeuronKernel, build_kernel, describe
from .options import MULTI_STEP


def _frozen(mapping: Mapping[str, Any] | None) -> tuple:
    return tuple(sorted((mapping or {}).items()))


@functools.lru_cache(maxsize=512)
def _derivation(spec: NeuronSpec, reset: Reset | None, detach_reset: bool, constants: tuple) -> Derivation:
    # bool: the cache takes 1 for True, and the derivation's text (kernel names) prints what it holds
    return bounded(spec.origin, "charge", lambda: derive(_built_on(_system(spec, reset, constants)),
                                                         bool(detach_reset)))


@functools.lru_cache(maxsize=256)
def _system(spec: NeuronSpec, reset: Reset | None, constants: tuple) -> StepSystem:
    """The step system, cached: the derivations with and without detach_reset share it."""
    return step_system(spec, reset, dict(constants))


def _built_on(result: Any) -> Any:
    """`result`, an earlier stage's, counted against the current stage's budget (`budget.reuse`)."""
    reuse(result)
    return result


def derivation(spec: NeuronSpec, reset: Reset | None = None, detach_reset: bool = False,
               constants: Mapping[str, float] | None = None) -> Derivation:
    """The derived step of `spec` under a reset rule (default: the spec's), cached; the reset sees the spike
    detached where `detach_reset` or the spec says so."""
    return _derivation(spec, reset, bool(detach_reset) or spec.detach_reset, _frozen(constants))


@dataclasses.dataclass(frozen=True)
class KernelRequest:
    """Everything that selects one generated kernel of a spec (hashable: kernels are cached by it)."""

    spec: NeuronSpec
    kernel: str                              # one of KERNELS
    dtype: str                               # torch's name of the storage dtype
    reset: Reset | None
    detach_reset: bool
    constants: tuple[tuple[str, float], ...]  # folded into the source
    surrogate: Surrogate
    tensors: tuple[tuple[str, Broadcast], ...]  # runtime tensor parameters: (name, how it spreads: codegen.options)
    store_state_seq: bool
    save_for_backward: bool
    grad_state_seq: bool
    grad_finals: bool
    given_inits: bool
    final_states: bool
    layout: Layout
    replay_charge: bool = False              # multi-step kernels save no h: backward replays it (`replaying_charge`)
    gradients: str = "all"                   # what BPTT stores (`codegen.options.GRADIENTS`)


@functools.lru_cache(maxsize=1024)
def _kernel(request: KernelRequest) -> NeuronKernel:
    return bounded(request.spec.origin, "charge", _build, request)


def _build(r: KernelRequest) -> NeuronKernel:
    spec = r.spec
    d = _derivation(spec, r.reset, r.detach_reset, r.constants)
    reuse(d)  # a derivation made by an earlier stage: its CPU time counts against this kernel's budget
    if r.replay_charge and r.kernel in MULTI_STEP:
        d = replaying_charge(d)
    symbols = {p.name: p for p in d.system.params}
    unknown = [name for name, _ in r.tensors if name not in symbols]
    if unknown:
        raise ValueError(f"{spec.name}: {unknown[0]!r} is not a runtime parameter of this kernel "
                         f"(runtime parameters: {sorted(symbols)})")
    options = KernelOptions(r.kernel, get_dtype(r.dtype), tuple((symbols[n], per) for n, per in r.tensors),
                            store_state_seq=r.store_state_seq, save_for_backward=r.save_for_backward,
                            grad_state_seq=r.grad_state_seq, grad_finals=r.grad_finals, given_inits=r.given_inits,
                            final_states=r.final_states, gradients=r.gradients, **r.layout.options())
    title = f"{spec.name}: {spec.doc}" if spec.doc else spec.name
    gradient = r.surrogate.gradient(SURROGATE_INPUT)
    try:
        return build_kernel(spec.name, d, options, gradient, describe(title, d, options))
    except LiteralError as error:  # a number the derivation made (constants folded, products), named by its source
        if _unprintable(gradient, get_dtype(r.dtype)):
            raise ConstantRangeError(f"{error} in a {r.dtype} kernel: the surrogate's gradient with "
                                     f"{r.surrogate.params} holds a number this dtype cannot represent",
                                     source=spec.origin, field="surrogate") from None
        raise ConstantRangeError(f"{error} in a {r.dtype} kernel: the equations, with their constants folded, hold "
                                 "a number this dtype cannot represent", source=spec.origin, field="params") from None


def _unprintable(expr: Any, dtype: DType) -> bool:
    """Whether a number of the sympy expression `expr` cannot be a constant of `dtype`'s arithmetic."""
    import sympy  # generation only: a warm process imports no sympy

    for number in expr.atoms(sympy.Number):
        try:
            dtype.compute.literal(float(number))
        except (LiteralError, OverflowError, TypeError, ValueError):
            return True
    return False


def neuron_kernel(spec: NeuronSpec | str, kernel: str = "fptt", dtype: Any = "float32", *, reset: Reset | None = None,
                  detach_reset: bool = False, constants: Mapping[str, float] | None = None,
                  surrogate: Any = None, per_neuron: Iterable[str] = (), tensors: Iterable[str] | None = None,
                  per_channel: Iterable[str] = (),
                  store_state_seq: bool = False, save_for_backward: bool = True,
                  grad_state_seq: bool = False, grad_finals: bool = True, given_inits: bool = True,
                  final_states: bool = True, lanes: int = 0, vector: bool = False, unroll: int = 1,
                  prefetch: int = 0, staged: int = 0, staged_blocks: int = 1, native: bool = False,
                  block: int = 256, replay: int = REPLAY_STEPS, replay_charge: bool = False,
                  gradients: str = "all") -> NeuronKernel:
    """One generated kernel of `spec` ('fptt', 'bptt', 'step-forward' or 'step-backward').

    `tensors` names the parameters passed as tensors (default: the spec's tensor parameters); those in
    `per_neuron` hold one value per neuron, those in `per_channel` one per channel (of neuron n: element
    n / ac_inner % ac_channels, the two sizes passed by value), the others a single value. Other runtime
    parameters are scalars passed by value; `constants` are folded into the source. `lanes` (neurons per
    thread), `vector` (one aligned access per transfer; the caller guarantees N % lanes == 0 and 16-byte
    aligned tensors) and
    `unroll` (of the time loop) and `prefetch` (steps of inputs kept in flight through shared memory) or
    `staged` with `staged_blocks` (blocks of that many steps of inputs loaded into registers so many blocks
    ahead; vector accesses only) only change speed. `native`
    computes float16/bfloat16 kernels in half2/bfloat162 arithmetic instead of float (faster math, less precise).
    `block`: threads per block the kernel will be launched with (the prefetch ring in shared memory is sized
    for it). Each layout number is an int within its bounds (`codegen.options.LAYOUT_BOUNDS`), else refused.
    `replay`: steps between the checkpoints that forward writes of a saved state whose steps backward can
    replay (ALIF's adaptation: `codegen.neuron_kernel.replay_steps`); 0 or 1 saves every step. Forward and backward
    must agree.
    `replay_charge=True`: the multi-step forward saves no h but a checkpoint of every state every `replay` steps,
    and the multi-step backward replays each segment's steps from x (`spec.derive.replaying_charge`); the two
    must agree. Single-step kernels are unchanged.
    `gradients` (BPTT with per-channel parameters): "all"; "sums", the per-channel sums alone; "corrected", every
    other gradient, the input's with c1[c] * x + c0[c] added (c1, c0: inputs `ac_grad_x_scale`,
    `ac_grad_x_shift`, one per channel) — a BatchNorm's two backward passes (`nn.batchnorm`).
    `grad_finals=False`: a backward kernel without inputs for the final states' gradients (they are zero).
    `given_inits=False`: each initial state is one number for every neuron, passed by value (no tensor to
    fill and read), and backward computes no gradient for it.
    `final_states=False`: a multi-step forward that does not write the final states (inference that starts
    every sequence afresh: one write per neuron and state less).
    """
    spec = as_spec(spec)
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; expected one of {', '.join(KERNELS)}")
    check_switches(detach_reset=detach_reset, store_state_seq=store_state_seq, save_for_backward=save_for_backward,
                   grad_state_seq=grad_state_seq, grad_finals=grad_finals, given_inits=given_inits,
                   final_states=final_states, replay_charge=replay_charge)
    names = tuple(tensor_param_names(spec) if tensors is None else _names("tensors", tensors))
    kinds: dict[str, Broadcast] = {}
    for kind, field, given in ((PER_NEURON, "per_neuron", per_neuron), (PER_CHANNEL, "per_channel", per_channel)):
        for name in _names(field, given):
            if name not in names:
                raise ValueError(f"{spec.name}: {name!r} is not a tensor parameter {list(names)}")
            if kinds.setdefault(name, kind) != kind:
                raise ValueError(f"{spec.name}: {name!r} is named both per_neuron and per_channel")
    chosen = get_surrogate(surrogate) if surrogate is not None else spec.surrogate
    _check_literals(spec, get_dtype(dtype), constants or {}, chosen)
    layout = Layout(lanes=lanes, vector=vector, unroll=unroll, prefetch=prefetch, staged=staged,
                    staged_blocks=staged_blocks, native=native, block=block, replay=replay)
    detached = bool(detach_reset) or spec.detach_reset  # the spec's detachment holds whatever the caller asks
    return _kernel(KernelRequest(spec, kernel, get_dtype(dtype).name, reset, detached, _frozen(constants),
                                 chosen, tuple((n, kinds.get(n, SHARED)) for n in names), store_state_seq,
                                 save_for_backward, grad_state_seq, grad_finals, given_inits, final_states, layout,
                                 bool(replay_charge), gradients))


def _names(field: str, given: Iterable[str]) -> tuple[str, ...]:
    """Parameter names, as an iterable of strings (a string alone would be read as its letters)."""
    names = tuple(given) if isinstance(given, Iterable) and not isinstance(given, str) else None
    if names is None or not all(isinstance(name, str) for name in names):
        raise TypeError(f"{field}: expected an iterable of parameter names, got {given!r}")
    return names


def _check_literals(spec: NeuronSpec, dtype: DType, constants: Mapping[str, float], surrogate: Surrogate) -> None:
    """Numbers printed into the source must fit the arithmetic type: refuse one that does not by its field
    (a float64 spec may hold constants that a float32 kernel of it cannot)."""
    compute = dtype.compute
    values = [(f"params.{p.name}", p.name, constants.get(p.name, p.default)) for p in spec.params
              if p.kind == "constant"]
    values += [(f"surrogate.{name}", name, value) for name, value in surrogate.params.items()]
    for field, name, value in values:
        try:
            compute.literal(float(value))
        except (TypeError, ValueError) as error:
            raise ConstantRangeError(f"{name} = {value!r} cannot be a {compute.name} constant of a {dtype.name} "
                                     f"kernel ({error})", source=spec.origin or "<python>", field=field,
                                     symbol=name) from None


def source(spec: NeuronSpec | str, kernel: str = "fptt", dtype: Any = "float32", **options: Any) -> str:
    """The CUDA source of one kernel of `spec` (see `neuron_kernel` for the options)."""
    return neuron_kernel(spec, kernel, dtype, **options).full_codes
