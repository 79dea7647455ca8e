"""Per-process plans of neuron layers: what a call needs to know that depends only on the configuration.

A `Plan` is built once per (spec, surrogate, reset, detach_reset, constants, tensor signature) and reused.
Functions that torch.compile must not trace into (they parse specs, derive, render kernels) are marked
`constant_result` (torch.compiler.assume_constant_result): Dynamo calls them while tracing and keeps their
result as a constant.
Dynamo can hand such functions only plain constants, so they take and return strings, numbers, bools and
tuples; specs and surrogates travel as *references*: a shipped spec's name, a surrogate's name, or the token
of an object registered here (`spec_ref`, `surrogate_ref`; modules register theirs when they are built).
The ops (a layer above) look a kernel plan up by its key; nothing here imports them.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from ..spec.load import is_spec_path, load_spec
from ..spec.model import NeuronSpec, Reset, check_reset, runtime_params, spec_text, tensor_param_names
from ..surrogate import Surrogate, get_surrogate
from . import nvrtc
from .neuron_launch import NeuronConfig

if TYPE_CHECKING:
    import sympy as sp

    from ..spec.derive import StepSystem


def constant_result(fn):
    """`torch.compiler.assume_constant_result`, without its import of Dynamo (seconds in a fresh process, paid
    by every user who never compiles): that decorator only sets this attribute, which Dynamo reads when it
    traces a call (tests/test_ops.py checks the two agree)."""
    fn._dynamo_marked_constant = True
    return fn


_OBJECTS: dict[str, Any] = {}   # token -> registered NeuronSpec or Surrogate
_PLANS: dict[str, Plan] = {}    # plan id -> Plan


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Arithmetic (and tensor parameter) dtype of a storage dtype: float32 for half and bfloat16."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


@constant_result  # Dynamo cannot trace the ctypes lookup of NVRTC: torch.compile keeps the answer instead
def default_backend(device_type: str) -> str:
    """'cuda' (the generated kernels) for CUDA tensors when NVRTC can be loaded, else 'reference' (torch ops)."""
    return "cuda" if device_type == "cuda" and nvrtc.found() else "reference"


def _register(kind: str, obj: Any, text: str) -> str:
    token = f"<{kind} {getattr(obj, 'name', '')} {hashlib.sha1(text.encode()).hexdigest()[:16]}>"
    _OBJECTS.setdefault(token, obj)
    return token


_SPEC_REFS: dict[int, tuple[NeuronSpec, str]] = {}


def spec_ref(spec: NeuronSpec | str) -> str:
    """A string that names `spec` for the functions below: a shipped spec's name as given, or a registered
    spec's token (a spec file is loaded here, so that an edited file is a new spec, not the old one's plans)."""
    if isinstance(spec, str):
        return spec_ref(load_spec(spec)) if is_spec_path(spec) else spec
    if not isinstance(spec, NeuronSpec):
        raise TypeError(f"spec: expected a NeuronSpec or the name of a shipped spec, got {type(spec).__name__}")
    known = _SPEC_REFS.get(id(spec))
    if known is not None and known[0] is spec:  # the same object again: skip re-serialising it (a hot path)
        return known[1]
    ref = _register("spec", spec, spec_text(spec))
    _SPEC_REFS[id(spec)] = (spec, ref)  # holding the spec keeps its id from being reused
    return ref


_SURROGATE_REFS: dict[int, tuple[Any, str, int]] = {}


def surrogate_ref(surrogate: Any) -> str | None:
    """None (the spec's surrogate), a surrogate's name as given, or the token of any surrogate object (of its
    values now: a frozen copy is registered, so that a later change of the object names other values)."""
    if surrogate is None or isinstance(surrogate, str):
        return surrogate
    known = _SURROGATE_REFS.get(id(surrogate))
    if known is not None and known[0] is surrogate and isinstance(surrogate, Surrogate) and (
            known[2] == surrogate.version):  # unchanged since: reuse
        return known[1]
    chosen = get_surrogate(surrogate).frozen()
    ref = _register("surrogate", chosen, repr((chosen.name, chosen.key())))
    # holding the object keeps its id from being reused
    _SURROGATE_REFS[id(surrogate)] = (surrogate, ref, surrogate.version if isinstance(surrogate, Surrogate) else -1)
    return ref


def resolve_spec(ref: NeuronSpec | str) -> NeuronSpec:
    """The spec a reference names: a registered token, a shipped spec's name, or a TOML file."""
    if isinstance(ref, NeuronSpec):
        return ref
    if not isinstance(ref, str):
        raise TypeError(f"spec: expected a NeuronSpec or the name of a shipped spec, got {type(ref).__name__}")
    found = _OBJECTS.get(ref)
    return found if isinstance(found, NeuronSpec) else load_spec(ref)


def _resolve_surrogate(spec: NeuronSpec, ref: str | None) -> Surrogate:
    if ref is None:
        return spec.surrogate
    found = _OBJECTS.get(ref)
    return found if isinstance(found, Surrogate) else get_surrogate(ref)


class SpecFacts(NamedTuple):
    """What a call needs to know of a spec, as constants Dynamo can hold (strings, numbers, tuples)."""

    name: str
    param_names: tuple[str, ...]
    defaults: tuple[tuple[str, float], ...]          # (parameter, default)
    constant_names: tuple[str, ...]                  # parameters folded into the source
    initial: tuple[tuple[str, Any], ...]             # (state, initial value or rule)
    domains: tuple[tuple[str, tuple[tuple[str, float], ...]], ...]  # (parameter, its (operator, limit) bounds)
    inputs: tuple[str, ...] = ("x",)                 # the step inputs' names


@constant_result
def spec_facts(ref: str) -> SpecFacts:
    """The facts of the spec that `ref` names (`spec_ref`)."""
    return _facts(ref)


@functools.lru_cache(maxsize=256)
def _facts(ref: str) -> SpecFacts:
    spec = resolve_spec(ref)
    return SpecFacts(spec.name, tuple(p.name for p in spec.params), tuple((p.name, p.default) for p in spec.params),
                     tuple(p.name for p in spec.params if p.kind == "constant"),
                     tuple((s.name, s.init) for s in spec.states),
                     tuple((p.name, tuple((b.operator, b.limit) for b in p.bounds)) for p in spec.params if p.domain),
                     spec.inputs)


@dataclasses.dataclass(frozen=True)
class Plan:
    """A neuron layer's configuration and the order of its op arguments."""

    spec: NeuronSpec                         # with any extra learnable parameters marked
    surrogate: Surrogate
    reset: Reset
    detach_reset: bool
    constants: tuple[tuple[str, float], ...]
    tensors: tuple[tuple[str, bool], ...]    # tensor parameters: (name, one value per neuron?), op order
    scalars: tuple[str, ...]                 # scalar parameters, op order
    states: tuple[str, ...]
    key: str                                 # the ops' key (kernel plans) or a plan id (reference plans)
    replay_charge: bool = False              # multi-step kernels save no h (`NeuronConfig.replay_charge`)

    @functools.cached_property
    def system(self) -> StepSystem:
        from ..spec.system import step_system  # derivation: the reference path only

        return step_system(self.spec, self.reset, dict(self.constants))

    @functools.cached_property
    def symbols(self) -> Mapping[str, sp.Symbol]:
        return dict(self.spec.parsed().param_symbols)

    @property
    def info(self) -> tuple:
        return self.states, self.tensors, self.scalars, self.reset

    @functools.cached_property
    def config(self) -> NeuronConfig:
        """What selects this layer's kernels (the ops run it under `key`)."""
        return NeuronConfig(self.spec, self.surrogate, self.reset, self.detach_reset, self.constants, self.tensors,
                            self.replay_charge)


@constant_result
def plan_for(spec: str, surrogate: str | None, reset: str | None, detach_reset: bool,
             constants: tuple[tuple[str, float], ...], signature: tuple[tuple[str, bool, bool], ...],
             kernels: bool, replay_charge: bool = False) -> str:
    """The id of a layer's plan (for kernel plans, the ops' key). `signature` lists the parameters given as
    tensors: (name, per neuron?, needs grad?); `kernels`: a plan of the generated kernels (the ops find its
    configuration by the key: `autocuda.ops.entry`), else of the reference; `replay_charge`: kernels that save no
    h (the reference ignores it)."""
    return _plan_id(spec, surrogate, reset, detach_reset, constants, signature, kernels, replay_charge)


@functools.lru_cache(maxsize=1024)
def _plan_id(spec: str, surrogate: str | None, reset: str | None, detach_reset: bool, constants: tuple,
             signature: tuple, kernels: bool, replay_charge: bool) -> str:
    resolved = resolve_spec(spec)
    chosen = _resolve_surrogate(resolved, surrogate)
    if kernels and not chosen.spiking:  # the kernels' forward is the step Θ
        raise ValueError(f"surrogate_function: {chosen!r} (the primitive in forward) runs on the torch reference "
                         "only: pass backend='torch' (a layer) or 'reference' (functional), or spiking=True")
    made = _plan(resolved, chosen, reset or resolved.reset, bool(detach_reset), constants, signature, kernels,
                 bool(replay_charge) and kernels)
    if not kernels:
        # The reference reads the derived step and the parameter symbols on every call: work them out here, outside
        # any trace, so that a layer compiled before its first eager call finds them cached instead of tracing the
        # derivation (sympy) and the lock of Python < 3.12's cached_property
        made.system, made.symbols  # noqa: B018
    return made.key


@constant_result
def plan_info(plan_id: str) -> tuple:
    """(state names, tensor parameters as (name, per neuron?), scalar parameter names, reset rule)."""
    return _PLANS[plan_id].info


def plan(plan_id: str) -> Plan:
    return _PLANS[plan_id]


def find_plan(plan_id: str) -> Plan | None:
    """The plan of this id, or None where this process built none."""
    return _PLANS.get(plan_id)


def get_plan(spec: NeuronSpec | str, surrogate: Any = None, reset: str | None = None, detach_reset: bool = False,
             constants: tuple = (), signature: tuple = (), kernels: bool = True, replay_charge: bool = False) -> Plan:
    """The plan of a layer, from objects or names (for introspection and tests; calls use `plan_for`)."""
    return _PLANS[plan_for(spec_ref(spec), surrogate_ref(surrogate), reset, detach_reset, constants, signature,
                           kernels, replay_charge)]


@functools.lru_cache(maxsize=1024)
def _plan(spec: NeuronSpec, surrogate: Surrogate, reset: str, detach_reset: bool, constants: tuple,
          signature: tuple, kernels: bool, replay_charge: bool = False) -> Plan:
    rule = check_reset(spec, reset)
    given = {name: per_neuron for name, per_neuron, _ in signature}
    # The kernels differentiate only what the spec calls learnable: a tensor that needs a gradient makes its
    # parameter learnable in a variant of the spec (the reference path gets every gradient from autograd).
    extra = {name for name, _, grad in signature if grad} - {p.name for p in spec.params if p.learnable}
    if kernels and extra:
        params = tuple(dataclasses.replace(p, kind="tensor", learnable=True) if p.name in extra else p
                       for p in spec.params)
        spec = dataclasses.replace(spec, params=params)
    folded = dict(constants)
    runtime = [n for n in runtime_params(spec, rule) if n not in folded]
    tensor_names = set(tensor_param_names(spec)) | set(given)
    tensors = tuple((n, given.get(n, False)) for n in runtime if n in tensor_names)
    scalars = tuple(n for n in runtime if n not in tensor_names)
    states = tuple(s.name for s in spec.states)
    if kernels:
        key = NeuronConfig(spec, surrogate, rule, detach_reset, constants, tensors, replay_charge).key
    else:
        text = repr((spec_text(spec), surrogate.key(), rule, detach_reset, constants, tensors))
        key = f"reference_{spec.name}_{hashlib.sha1(text.encode()).hexdigest()[:16]}"
    built = Plan(spec, surrogate, rule, detach_reset, constants, tensors, scalars, states, key, replay_charge)
    known = _PLANS.setdefault(key, built)
    if known != built:  # a digest collision: never run one neuron's kernels for another
        raise RuntimeError(f"autocuda plan key {key!r} already names a different neuron configuration")
    if not kernels:  # the reference's sympy work now: under torch.compile this runs as a constant, not traced
        from ..reference import prepare

        prepare(known.system), known.surrogate.gradient_of_x()
    return known
