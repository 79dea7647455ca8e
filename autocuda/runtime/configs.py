"""Per-process layer configurations (`NeuronConfig`), built once per (spec, surrogate, reset, detach_reset, constants,
tensor signature) and found by key by the ops, which nothing here imports. Functions torch.compile must not trace into
(they parse, derive, render) are `constant_result`: Dynamo calls them while tracing and keeps the result. Dynamo can
hand such functions only plain constants, so they take and return strings, numbers, bools and tuples; specs and
surrogates travel as references: a shipped spec's name, a surrogate's name, or a token (`spec_ref`, `surrogate_ref`)."""
from __future__ import annotations

import dataclasses
import functools
import hashlib
from typing import Any, NamedTuple

import torch

from ..base.errors import SpecError
from ..spec.draws import makes_draws
from ..spec.load import is_spec_path, load_spec
from ..spec.model import NeuronSpec, check_reset, runtime_params, spec_text, tensor_param_names
from ..spec.ode import TIME_STEP
from ..spec.surrogate import Surrogate, get_surrogate
from ..toolchain import nvrtc
from .neuron_launch import NeuronConfig


def constant_result(fn):
    """`torch.compiler.assume_constant_result` without importing Dynamo (seconds, paid by users who never compile):
    it only sets this attribute, which Dynamo reads when tracing (tests/test_ops.py checks the two agree)."""
    fn._dynamo_marked_constant = True
    return fn


_OBJECTS: dict[str, Any] = {}   # token -> registered NeuronSpec or Surrogate
_CONFIGS: dict[str, NeuronConfig] = {}  # key -> configuration


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


def _unregistered(kind: str, ref: str) -> SpecError | None:
    """The error for a token (`_register`) this process never registered, or None where `ref` is no token: tokens
    live in the process that made them, so one kept across a pickle or a process names nothing here."""
    if not (ref.startswith(f"<{kind} ") and ref.endswith(">")) or ref in _OBJECTS:
        return None
    return SpecError(f"{ref!r} is a reference to a {kind} registered in another process (tokens live in the process "
                     f"that made them: one kept across a pickle or sent to another process names nothing here); "
                     f"pass the {'NeuronSpec' if kind == 'spec' else 'surrogate'} object itself",
                     field="surrogate" if kind == "surrogate" else "spec", symbol=ref)


# Memos of `spec_ref` and `surrogate_ref` by the object's id (each entry holds its object, so the id stays its own while
# it is kept), bounded: specs and surrogates made without end (a fresh surrogate per functional call) must neither
# grow them nor be kept alive by them; an object met again after a clear is worked out again, to the same token
_REFS_LIMIT = 1024
_SPEC_REFS: dict[int, tuple[NeuronSpec, str]] = {}


def spec_ref(spec: NeuronSpec | str) -> str:
    """A shipped spec's name as given, or a registered spec's token (a spec file loads here: edited, it is new)."""
    if isinstance(spec, str):
        return spec_ref(load_spec(spec)) if is_spec_path(spec) else spec
    if not isinstance(spec, NeuronSpec):
        raise TypeError(f"spec: expected a NeuronSpec or the name of a shipped spec, got {type(spec).__name__}")
    known = _SPEC_REFS.get(id(spec))
    if known is not None and known[0] is spec:  # the same object again: skip re-serialising it (a hot path)
        return known[1]
    ref = _register("spec", spec, spec_text(spec))
    if len(_SPEC_REFS) >= _REFS_LIMIT:
        _SPEC_REFS.clear()
    _SPEC_REFS[id(spec)] = (spec, ref)  # holding the spec keeps its id from being reused
    return ref


_SURROGATE_REFS: dict[int, tuple[Any, str, int]] = {}  # id -> (object, held so its id is not reused; token; version)


def surrogate_ref(surrogate: Any) -> str | None:
    """None (the spec's surrogate), a name as given, or the token of a frozen copy of an object's current values."""
    if surrogate is None or isinstance(surrogate, str):
        return surrogate
    known = _SURROGATE_REFS.get(id(surrogate))
    if known is not None and known[0] is surrogate and isinstance(surrogate, Surrogate) and (
            known[2] == surrogate.version):  # unchanged since: reuse
        return known[1]
    chosen = get_surrogate(surrogate).frozen()
    ref = _register("surrogate", chosen, repr((chosen.name, chosen.key())))
    if len(_SURROGATE_REFS) >= _REFS_LIMIT:
        _SURROGATE_REFS.clear()
    _SURROGATE_REFS[id(surrogate)] = (surrogate, ref, surrogate.version if isinstance(surrogate, Surrogate) else -1)
    return ref


def resolve_spec(ref: NeuronSpec | str) -> NeuronSpec:
    """The spec a reference names: a registered token, a shipped spec's name, or a TOML file."""
    if isinstance(ref, NeuronSpec):
        return ref
    if not isinstance(ref, str):
        raise TypeError(f"spec: expected a NeuronSpec or the name of a shipped spec, got {type(ref).__name__}")
    found = _OBJECTS.get(ref)
    if found is None and (error := _unregistered("spec", ref)) is not None:
        raise error
    return found if isinstance(found, NeuronSpec) else load_spec(ref)


def _resolve_surrogate(spec: NeuronSpec, ref: str | None) -> Surrogate:
    if ref is None:
        return spec.surrogate
    found = _OBJECTS.get(ref)
    if found is None and (error := _unregistered("surrogate", ref)) is not None:
        raise error
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
    draws: bool = False                              # whether its step draws (`spec.draws.makes_draws`)
    reset: str = "hard"                              # its own reset rule (a call's `reset` may choose another)


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
                     _domains(spec), spec.inputs, makes_draws(spec), spec.reset)


def _domains(spec: NeuronSpec) -> tuple[tuple[str, tuple[tuple[str, float], ...]], ...]:
    """Each parameter's declared bounds; an ODE's `time_step` is positive where it declares none (the spec's own
    check reads its default alone: a value given at run time is checked at each call)."""
    found = [(p.name, tuple((b.operator, b.limit) for b in p.bounds)) for p in spec.params if p.domain]
    if spec.ode and all(name != TIME_STEP for name, _ in found):
        found.append((TIME_STEP, ((">", 0.0),)))
    return tuple(found)


@constant_result
def config_for(spec: str, surrogate: str | None, reset: str | None, detach_reset: bool,
               constants: tuple[tuple[str, float], ...], signature: tuple[tuple[str, bool, bool], ...],
               kernels: bool, replay_charge: bool = False) -> str:
    """The key of a layer's configuration. `signature`: parameters given as tensors (name, per neuron?, needs grad?);
    `kernels`: the generated kernels', else the reference's; `replay_charge`: kernels save no h (not the reference)."""
    return _config_key(spec, surrogate, reset, detach_reset, constants, signature, kernels, replay_charge)


@functools.lru_cache(maxsize=1024)
def _config_key(spec: str, surrogate: str | None, reset: str | None, detach_reset: bool, constants: tuple,
                signature: tuple, kernels: bool, replay_charge: bool) -> str:
    resolved = resolve_spec(spec)
    chosen = _resolve_surrogate(resolved, surrogate)
    if kernels and not chosen.spiking:  # the kernels' forward is the step Θ
        raise ValueError(f"surrogate_function: {chosen!r} (the primitive in forward) runs on the torch reference "
                         "only: pass backend='torch' (a layer) or 'reference' (functional), or spiking=True")
    # a spec whose reset detaches the spike detaches it in every call (a call's detach_reset only adds it); None
    # alone means the spec's reset (`reset or ...` took "" for it)
    return _config(resolved, chosen, resolved.reset if reset is None else reset,
                   bool(detach_reset) or resolved.detach_reset, constants,
                   signature, kernels, bool(replay_charge) and kernels).key


@constant_result
def config_info(key: str) -> tuple:
    """(state names, tensor parameters as (name, how it spreads), scalar parameter names, reset rule)."""
    c = _CONFIGS[key]
    return c.state_names, c.tensors, c.scalars, c.reset


def config(key: str) -> NeuronConfig:
    """The configuration of this key; KeyError where this process built none."""
    found = _CONFIGS.get(key)
    if found is None:
        raise KeyError(f"unknown autocuda neuron key {key!r}: no call of this process ran its configuration; call the "
                       "layer (autocuda.nn) or autocuda.functional with it once before its ops run (a loaded "
                       "torch.export program's, say)")
    return found


def get_config(spec: NeuronSpec | str, surrogate: Any = None, reset: str | None = None, detach_reset: bool = False,
               constants: tuple = (), signature: tuple = (), kernels: bool = True, replay_charge: bool = False
               ) -> NeuronConfig:
    """A layer's configuration from objects or names, for introspection and tests (calls use `config_for`)."""
    return _CONFIGS[config_for(spec_ref(spec), surrogate_ref(surrogate), reset, detach_reset, constants, signature,
                               kernels, replay_charge)]


@functools.lru_cache(maxsize=1024)
def _config(spec: NeuronSpec, surrogate: Surrogate, reset: str, detach_reset: bool, constants: tuple,
            signature: tuple, kernels: bool, replay_charge: bool = False) -> NeuronConfig:
    rule = check_reset(spec, reset)
    given = {name: per_neuron for name, per_neuron, _ in signature}
    # Kernels differentiate only learnable parameters: one given as a tensor needing a gradient is made learnable.
    extra = {name for name, _, grad in signature if grad} - {p.name for p in spec.params if p.learnable}
    if kernels and extra:
        params = tuple(dataclasses.replace(p, kind="tensor", learnable=True) if p.name in extra else p
                       for p in spec.params)
        spec = dataclasses.replace(spec, params=params)
    tensor_names = set(tensor_param_names(spec)) | set(given)
    tensors = tuple((n, given.get(n, False)) for n in runtime_params(spec, rule)
                    if n in tensor_names and n not in dict(constants))
    built = NeuronConfig(spec, surrogate, rule, detach_reset, constants, tensors, replay_charge, not kernels)
    known = _CONFIGS.setdefault(built.key, built)
    if known != built:  # a digest collision: never run one neuron's kernels for another
        raise RuntimeError(f"autocuda key {built.key!r} already names a different neuron configuration")
    if not kernels:
        # The reference reads it on every call: work it out now, outside any trace, lest a layer compiled before its
        # first eager call trace the derivation (sympy) and the lock of Python < 3.12's cached_property
        known.reference_step  # noqa: B018
    return known
