"""Per-process plans of neuron layers: what a call needs to know that depends only on the configuration.

A `Plan` is built once per (spec, surrogate, reset, detach_reset, constants, tensor signature) and reused.
The functions here that torch.compile must not trace into (they parse specs, derive, render kernels) are
marked `torch.compiler.assume_constant_result`: Dynamo calls them while tracing and keeps their result as a
constant, so a compiled model holds no graph break for them.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
from collections.abc import Mapping
from typing import Any

import sympy as sp
import torch

from ..kernels import tensor_param_names
from ..spec.derive import StepSystem
from ..spec.model import NeuronSpec, load_spec
from ..spec.system import runtime_params, step_system
from ..surrogate import Surrogate, get_surrogate

HAS_CUPY = importlib.util.find_spec("cupy") is not None  # found, not imported: import costs seconds


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Arithmetic (and tensor parameter) dtype of a storage dtype: float32 for half and bfloat16."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def default_backend(device_type: str) -> str:
    """'cuda' (the generated kernels) for CUDA tensors when CuPy is installed, else 'reference' (torch ops)."""
    return "cuda" if device_type == "cuda" and HAS_CUPY else "reference"


@dataclasses.dataclass(frozen=True)
class SpecFacts:
    """What argument checking needs from a spec."""

    name: str
    params: tuple[str, ...]                         # in declaration order
    defaults: tuple[tuple[str, float], ...]         # (name, default) of every parameter
    constants: tuple[str, ...]                      # compile-time constant parameters
    initial: tuple[tuple[str, float | str], ...]    # each state's initial value: a number or a parameter name


@torch.compiler.assume_constant_result
def resolve_spec(spec: NeuronSpec | str) -> NeuronSpec:
    """A NeuronSpec, or the shipped spec (or TOML file) of that name."""
    if isinstance(spec, NeuronSpec):
        return spec
    if isinstance(spec, str):
        return load_spec(spec)
    raise TypeError(f"spec: expected a NeuronSpec or the name of a shipped spec, got {type(spec).__name__}")


@torch.compiler.assume_constant_result
def spec_facts(spec: NeuronSpec) -> SpecFacts:
    return _facts(spec)


@functools.lru_cache(maxsize=256)
def _facts(spec: NeuronSpec) -> SpecFacts:
    return SpecFacts(spec.name, tuple(p.name for p in spec.params), tuple((p.name, p.default) for p in spec.params),
                     tuple(p.name for p in spec.params if p.kind == "constant"),
                     tuple((s.name, s.init) for s in spec.states))


@dataclasses.dataclass(frozen=True)
class Plan:
    """A neuron layer's configuration and the order of its op arguments."""

    spec: NeuronSpec                         # with any extra learnable parameters marked
    surrogate: Surrogate
    reset: str
    detach_reset: bool
    constants: tuple[tuple[str, float], ...]
    tensors: tuple[tuple[str, bool], ...]    # tensor parameters: (name, one value per neuron?), op order
    scalars: tuple[str, ...]                 # scalar parameters, op order
    states: tuple[str, ...]
    key: str | None                          # the ops' key; None for plans of the reference backend

    @functools.cached_property
    def system(self) -> StepSystem:
        return step_system(self.spec, self.reset, dict(self.constants))

    @functools.cached_property
    def symbols(self) -> Mapping[str, sp.Symbol]:
        return dict(self.spec.parsed().param_symbols)


@torch.compiler.assume_constant_result
def plan_for(spec: NeuronSpec, surrogate: Any, reset: str | None, detach_reset: bool,
             constants: tuple[tuple[str, float], ...], signature: tuple[tuple[str, bool, bool], ...],
             kernels: bool) -> Plan:
    """The plan of a layer. `signature` lists the parameters given as tensors: (name, per neuron?, needs
    grad?); `kernels` registers the ops' configuration (not needed by the reference backend)."""
    chosen = spec.surrogate if surrogate is None else get_surrogate(surrogate)
    return _plan(spec, chosen, reset or spec.reset, detach_reset, constants, signature, kernels)


@functools.lru_cache(maxsize=1024)
def _plan(spec: NeuronSpec, surrogate: Surrogate, reset: str, detach_reset: bool, constants: tuple,
          signature: tuple, kernels: bool) -> Plan:
    step_system(spec, reset, dict(constants))  # refuses an unknown reset rule, or a hard one without v_reset
    given = {name: per_neuron for name, per_neuron, _ in signature}
    # The kernels differentiate only what the spec calls learnable: a tensor that needs a gradient makes its
    # parameter learnable in a variant of the spec (the reference path gets every gradient from autograd).
    extra = {name for name, _, grad in signature if grad} - {p.name for p in spec.params if p.learnable}
    if kernels and extra:
        params = tuple(dataclasses.replace(p, kind="tensor", learnable=True) if p.name in extra else p
                       for p in spec.params)
        spec = dataclasses.replace(spec, params=params)
    folded = dict(constants)
    runtime = [n for n in runtime_params(spec, reset) if n not in folded]
    tensor_names = set(tensor_param_names(spec)) | set(given)
    tensors = tuple((n, given.get(n, False)) for n in runtime if n in tensor_names)
    scalars = tuple(n for n in runtime if n not in tensor_names)
    states = tuple(s.name for s in spec.states)
    key = None
    if kernels:
        from .. import ops
        from .neuron import NeuronConfig

        config = NeuronConfig(spec, surrogate, reset, detach_reset, constants, tensors)
        key = ops.register(config)
    return Plan(spec, surrogate, reset, detach_reset, constants, tensors, scalars, states, key)


@torch.compiler.assume_constant_result
def layout(key: str, single_step: bool, store_state_seq: bool, save: bool) -> tuple[str, ...]:
    """Names of the forward op's outputs, in order (see `autocuda.ops.forward_outputs`)."""
    from .. import ops

    return ops.forward_outputs(key, single_step, store_state_seq, save)
