"""Functional API: run a neuron over a sequence (`multi_step`) or one step (`single_step`).

Where it runs (`backend`): "cuda" launches the generated kernels through the `autocuda::neuron_*` ops;
"host" runs the same ops on CPU tensors through the host runner (for tests); "reference" evaluates the step
with torch ops (differentiable by autograd; any device). The default is "cuda" for CUDA tensors when CuPy is
installed, else "reference".

Everything that depends only on the layer's configuration (spec, reset, which parameters are tensors, ...) is
resolved once per process into a `Plan` (see `autocuda.runtime.cache`), outside what torch.compile traces, so
a compiled model sees shape checks, reshapes and one custom op per layer.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from . import ops
from .runtime.cache import (
    compute_dtype,
    default_backend,
    layout,
    plan,
    plan_for,
    plan_info,
    spec_facts,
    spec_ref,
    surrogate_ref,
)
from .spec.model import NeuronSpec

__all__ = ["multi_step", "single_step"]

Tensor = torch.Tensor
SUPPORTED_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def multi_step(spec: NeuronSpec | str, x_seq: Tensor, *initial_states: Tensor, surrogate: Any = None,
               detach_reset: bool = False, reset: str | None = None, store_state_seq: bool = False,
               backend: str | None = None, **params: Any
               ) -> tuple[Tensor, tuple[Tensor, ...], tuple[Tensor, ...] | None]:
    """Run `spec` over x_seq [T, *]: (spike_seq [T, *], final states, state sequences [T, *] or None).

    Initial states follow the spec's order (the membrane first), each a tensor of the neuron shape or one
    number for every neuron; missing ones start at the spec's initial values. When every initial state is a
    number the kernels start from it directly (no state tensor is filled or read; it gets no gradient).
    Parameters: floats (passed by value), tensors broadcastable to the neuron shape [*] (an
    `nn.Parameter`, or any tensor requiring grad, is learnable), defaults from the spec; `v_reset=None` means
    a soft reset. `reset` ('hard', 'soft', 'none') overrides the spec's reset rule.
    """
    _check_input(x_seq, "x_seq", 2)
    call = _Call(spec, x_seq, x_seq.shape[1:], initial_states, surrogate, detach_reset, reset, backend, params)
    steps = x_seq.shape[0]
    if steps == 0:  # nothing to run: empty sequences, the final states are the initial ones
        seqs = tuple(x_seq.new_empty(x_seq.shape) for _ in call.states) if store_state_seq else None
        return x_seq.new_empty(x_seq.shape), tuple(call.state_tensors()), seqs
    if call.backend == "reference":
        return _reference_multi(call, x_seq, store_state_seq)
    names, outputs = call.launch(_flat(x_seq, (steps, call.numel)), False, store_state_seq)
    by_name = dict(zip(names, outputs))
    shape = tuple(x_seq.shape)
    spikes = _shaped(by_name["spike_seq"], shape)
    finals = tuple(_shaped(by_name[f"{s}_final"], call.shape) for s in call.state_names)
    seqs = tuple(_shaped(by_name[f"{s}_seq"], shape) for s in call.state_names) if store_state_seq else None
    return spikes, finals, seqs


def single_step(spec: NeuronSpec | str, x: Tensor, *states: Tensor, surrogate: Any = None,
                detach_reset: bool = False, reset: str | None = None, backend: str | None = None, **params: Any
                ) -> tuple[Tensor, tuple[Tensor, ...]]:
    """One step of `spec` on x [*] from `states` (each [*]; missing ones start at the spec's initial values):
    (spike, new states). Arguments as in `multi_step`."""
    _check_input(x, "x", 0)
    call = _Call(spec, x, x.shape, states, surrogate, detach_reset, reset, backend, params)
    if call.backend == "reference":
        from . import reference as ref  # derives the step with sympy: imported only for this path

        spike, new_states, _ = ref.step(plan(call.key).system, *call.reference_args(x))
        return spike.to(x.dtype), tuple(s.to(x.dtype) for s in new_states)
    names, outputs = call.launch(_flat(x, (call.numel,)), True, False)
    by_name = dict(zip(names, outputs))
    shape = tuple(x.shape)
    return _shaped(by_name["spike_seq"], shape), tuple(_shaped(by_name[f"{s}_final"], shape) for s in call.state_names)


def _check_input(x: Any, name: str, min_dim: int) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name}: expected a floating dtype (float32, float64, float16, bfloat16), got {x.dtype}")
    if x.dim() < min_dim:
        raise ValueError(f"{name}: expected a tensor of shape [T, *] (at least {min_dim} dims), "
                         f"got shape {tuple(x.shape)}")


class _Call:
    """One call's arguments checked, defaults filled in, and matched to the layer's plan."""

    def __init__(self, spec: Any, x: Tensor, shape: torch.Size, states: Sequence[Tensor], surrogate: Any,
                 detach_reset: bool, reset: str | None, backend: str | None, params: dict[str, Any]):
        ref = spec_ref(spec)  # modules pass references already: nothing here for torch.compile to trace into
        self.name, self.param_names, defaults, self.constant_names, self.init_rules = spec_facts(ref)
        self.x, self.shape, self.numel = x, tuple(shape), _numel(shape)
        self.compute = compute_dtype(x.dtype)
        self.backend = backend or default_backend(x.device.type)
        if self.backend not in ("cuda", "host", "reference"):
            raise ValueError(f"backend: expected 'cuda', 'host', 'reference' or None, got {backend!r}")
        values, reset = self._values(dict(defaults), params, reset)
        constants = tuple((n, float(values.pop(n))) for n in self.constant_names if n in values)
        signature = tuple((n, v.numel() != 1, bool(v.requires_grad) and torch.is_grad_enabled())
                          for n, v in values.items() if isinstance(v, torch.Tensor))
        self.key = plan_for(ref, surrogate_ref(surrogate), reset, bool(detach_reset), constants, signature,
                            self.backend != "reference")
        self.state_names, self.tensors, self.scalars, self.reset = plan_info(self.key)
        self.values = values
        self.states = self._states(states)

    def _values(self, values: dict[str, Any], params: dict[str, Any], reset: str | None
                ) -> tuple[dict[str, Any], str | None]:
        unknown = [n for n in params if n not in self.param_names]
        if unknown:
            raise TypeError(f"unknown parameter {unknown[0]!r} for neuron {self.name!r} "
                            f"(parameters: {', '.join(self.param_names)})")
        for name, value in params.items():
            if name == "v_reset" and value is None:  # SpikingJelly's convention: no reset value = soft reset
                reset = "soft" if reset is None else reset
                continue
            if name in self.constant_names and isinstance(value, torch.Tensor):
                raise TypeError(f"parameter {name!r} is a compile-time constant of {self.name!r}: pass a number")
            values[name] = self._param(name, value)
        return values, reset

    def _param(self, name: str, value: Any) -> float | Tensor:
        if isinstance(value, torch.Tensor):
            if not value.is_floating_point():
                raise TypeError(f"parameter {name!r}: expected a floating tensor, got {value.dtype}")
            if value.device != self.x.device:
                raise ValueError(f"parameter {name!r}: on {value.device}, but the input is on {self.x.device}")
            if not _broadcasts(tuple(value.shape), self.shape):
                raise ValueError(f"parameter {name!r}: shape {tuple(value.shape)} does not broadcast to the "
                                 f"neuron shape {self.shape}")
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"parameter {name!r}: expected a number or a tensor, got {type(value).__name__}")
        return value

    def _states(self, states: Sequence[Tensor]) -> list[Tensor]:
        names = self.state_names
        if len(states) > len(names):
            raise TypeError(f"neuron {self.name!r} has {len(names)} states ({', '.join(names)}), "
                            f"got {len(states)} initial values")
        return [self._check_state(name, states[i]) if i < len(states) else self._initial(name)
                for i, name in enumerate(names)]

    def _check_state(self, name: str, state: Any) -> Tensor | float:
        x = self.x
        if isinstance(state, (int, float)) and not isinstance(state, bool):
            return float(state)
        if not isinstance(state, torch.Tensor):
            raise TypeError(f"state {name!r}: expected a torch.Tensor or a number, got {type(state).__name__}")
        if tuple(state.shape) != self.shape:
            raise ValueError(f"state {name!r}: expected shape {self.shape} (the neuron shape), got "
                             f"{tuple(state.shape)}")
        if state.dtype != x.dtype:
            raise TypeError(f"state {name!r}: expected dtype {x.dtype} (the input's), got {state.dtype}")
        if state.device != x.device:
            raise ValueError(f"state {name!r}: on {state.device}, but the input is on {x.device}")
        return state

    def _initial(self, name: str) -> Tensor | float:
        init = dict(self.init_rules)[name]
        if init == "v_reset" and self.reset != "hard":
            init = 0.0
        value = self.values[init] if isinstance(init, str) else init
        if isinstance(value, torch.Tensor):
            return value.detach().to(self.x.dtype).expand(self.shape).clone()
        return float(value)

    def state_tensors(self) -> list[Tensor]:
        """The initial states as tensors of the neuron shape (numbers filled in)."""
        return [s if isinstance(s, torch.Tensor) else self.x.new_full(self.shape, s) for s in self.states]

    # -- running --------------------------------------------------------------------------------------
    def tensor_args(self) -> list[Tensor]:
        out = []
        for name, per_neuron in self.tensors:
            value = self.values[name]
            if not isinstance(value, torch.Tensor):  # a tensor parameter left at its default
                value = torch.full((1,), float(value), dtype=self.compute, device=self.x.device)
            value = value.to(self.compute)
            out.append(value.expand(self.shape).reshape(self.numel) if per_neuron else value.reshape(1))
        return out

    def launch(self, x: Tensor, single_step: bool, store_state_seq: bool) -> tuple[tuple[str, ...], list[Tensor]]:
        if any(isinstance(s, torch.Tensor) for s in self.states):
            states, initial = [_flat(s, (self.numel,)) for s in self.state_tensors()], []
        else:  # numbers only: the kernels start from them (nothing to fill, read or differentiate)
            states, initial = [], list(self.states)
        tensors = self.tensor_args()
        scalars = [float(self.values[n]) for n in self.scalars]
        save = torch.is_grad_enabled() and any(t.requires_grad for t in (x, *states, *tensors))
        outputs = ops.forward(self.key, x, states, initial, tensors, scalars, store_state_seq, save)
        return layout(self.key, single_step, store_state_seq, save), outputs

    def reference_args(self, x: Tensor) -> tuple:
        """(x, states, params by symbol, surrogate, detach_reset) for `reference`, in the compute dtype."""
        layer = plan(self.key)
        params = {layer.symbols[n]: (v.to(self.compute) if isinstance(v, torch.Tensor) else v)
                  for n, v in self.values.items() if n in layer.symbols}
        states = [s.to(self.compute) for s in self.state_tensors()]
        return x.to(self.compute), states, params, layer.surrogate, layer.detach_reset


def _flat(t: Tensor, shape: tuple[int, ...]) -> Tensor:
    """`t` as a contiguous tensor of `shape` (the kernels' [T, N] or [N]): itself when it already is one, since
    a reshape would add a view, and an autograd node, to every call."""
    if tuple(t.shape) == shape and t.is_contiguous():
        return t
    return t.reshape(shape).contiguous()


def _shaped(t: Tensor, shape: tuple[int, ...]) -> Tensor:
    """A kernel output viewed in the caller's shape (no view when it already has it)."""
    return t if tuple(t.shape) == shape else t.view(shape)


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for size in shape:  # not math.prod: torch.compile traces a plain loop over (symbolic) sizes
        n = n * size
    return n


def _broadcasts(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """`shape` expands to `target` (numpy rules, without growing `target`)."""
    return len(shape) <= len(target) and all(a in (1, b) for a, b in zip(reversed(shape), reversed(target)))


def _reference_multi(call: _Call, x_seq: Tensor, store_state_seq: bool):
    from . import reference as ref  # derives the step with sympy: imported only for this path

    x, states, params, surrogate, detach = call.reference_args(x_seq)
    spikes, finals, seqs = ref.multi_step(plan(call.key).system, x, states, params, surrogate, detach)
    dtype = x_seq.dtype
    finals = tuple(s.to(dtype) for s in finals)
    return spikes.to(dtype), finals, (tuple(s.to(dtype) for s in seqs) if store_state_seq else None)
