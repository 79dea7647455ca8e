"""Neuron layers as `torch.nn.Module`s, with SpikingJelly-compatible constructors.

A layer keeps its states between calls as attributes named after the spec's states (`self.v`, `self.w`, ...):
a number until the first call, then tensors of the neuron shape. `reset()` restores the initial values
(SpikingJelly's `functional.reset_net` calls it). step_mode 's' takes x [*], 'm' takes x [T, *].

SpikingJelly class -> spec, and its argument names where they differ from the spec's parameter names:

| class               | spec             | renamed / extra arguments                                    |
|---------------------|------------------|--------------------------------------------------------------|
| `IFNode`            | `if`             |                                                              |
| `LIFNode`           | `lif`            | decay_input: the spec option                                 |
| `ParametricLIFNode` | `parametric_lif` | init_tau -> learnable w = -log(init_tau - 1); decay_input   |
| `QIFNode`           | `qif`            |                                                              |
| `EIFNode`           | `eif`            | (delta_T, theta_rh as in SpikingJelly)                       |
| `IzhikevichNode`    | `izhikevich`     | w_rest: initial value of the state w                         |
| `AdExNode` (new)    | `adex`           | w_rest: initial value of the state w                         |
| `ALIFNode` (new)    | `alif`           |                                                              |

`backend`: None picks the kernels for CUDA tensors (the reference on CPU); SpikingJelly's 'torch' means our
torch-op reference, 'cupy' our kernels.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from . import functional as F
from .runtime.cache import resolve_spec, spec_ref, surrogate_ref
from .spec.model import NeuronSpec
from .surrogate import Sigmoid, get_surrogate

__all__ = ["Neuron", "IFNode", "LIFNode", "ParametricLIFNode", "QIFNode", "EIFNode", "IzhikevichNode", "AdExNode",
           "ALIFNode"]

_BACKENDS = {None: None, "auto": None, "torch": "reference", "reference": "reference", "cupy": "cuda",
             "cuda": "cuda", "host": "host"}
_UNSET: Any = object()
SIGMOID = Sigmoid()  # the default surrogate (SpikingJelly's); surrogates are immutable, so one object serves all


class Neuron(nn.Module):
    """A layer of neurons of any spec: `Neuron('lif', tau=3.0)`, `Neuron(my_spec, v_reset=None)`.

    Parameters are the spec's (floats, tensors broadcast over neurons, or `nn.Parameter`s, which are learned;
    the spec's learnable parameters become `nn.Parameter`s by default). `v_reset=None` means a soft reset.
    `options` sets the spec's compile-time options; `initial` overrides states' initial values.
    """

    def __init__(self, spec: NeuronSpec | str, *, surrogate_function: Any = SIGMOID, detach_reset: bool = False,
                 step_mode: str = "s", store_v_seq: bool = False, backend: str | None = None,
                 options: Mapping[str, bool] | None = None, initial: Mapping[str, float] | None = None,
                 **params: Any):
        super().__init__()
        spec = resolve_spec(spec)
        self.spec = spec.with_options(**options) if options else spec
        if step_mode not in ("s", "m"):
            raise ValueError(f"step_mode: expected 's' (single step) or 'm' (multi step), got {step_mode!r}")
        if backend not in _BACKENDS:
            raise ValueError(f"backend: expected one of {[b for b in _BACKENDS if b]} or None, got {backend!r}")
        self.surrogate_function = surrogate_function
        self._surrogate = get_surrogate(surrogate_function)
        # References by string: what torch.compile's Dynamo can pass around as constants (see runtime.cache)
        self._spec_ref, self._surrogate_ref = spec_ref(self.spec), surrogate_ref(self._surrogate)
        self._state_names = tuple(s.name for s in self.spec.states)
        self.detach_reset, self.step_mode, self.store_v_seq = bool(detach_reset), step_mode, bool(store_v_seq)
        self.backend = backend
        self._param_names = tuple(p.name for p in self.spec.params)
        self._set_params(params)
        states = {s.name: s.init for s in self.spec.states}
        unknown = set(initial or {}) - set(states)
        if unknown:
            raise TypeError(f"initial: {sorted(unknown)[0]!r} is not a state of {self.spec.name!r} "
                            f"(states: {', '.join(states)})")
        self._initial = {**states, **(initial or {})}
        for name in states:
            if hasattr(type(self), name) or name in self._param_names:
                raise ValueError(f"state {name!r} of {self.spec.name!r} clashes with an attribute of {type(self)}")
        self.reset()

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        # References name objects registered in the process that built the layer (unpickling: register here)
        self._spec_ref, self._surrogate_ref = spec_ref(self.spec), surrogate_ref(self._surrogate)

    def _set_params(self, params: Mapping[str, Any]) -> None:
        unknown = [n for n in params if n not in self._param_names]
        if unknown:
            raise TypeError(f"unknown parameter {unknown[0]!r} for neuron {self.spec.name!r} "
                            f"(parameters: {', '.join(self._param_names)})")
        for p in self.spec.params:
            value = params.get(p.name, _UNSET)
            if value is _UNSET:
                value = nn.Parameter(torch.tensor(p.default)) if p.learnable else p.default
            if isinstance(value, nn.Parameter):
                self.register_parameter(p.name, value)
            elif isinstance(value, torch.Tensor):
                self.register_buffer(p.name, value)
            else:
                setattr(self, p.name, value)

    # -- state ----------------------------------------------------------------------------------------
    @property
    def state_names(self) -> tuple[str, ...]:
        return self._state_names

    def reset(self) -> None:
        """Restore every state to its initial value (a number, or the value of the parameter it names)."""
        for name in self.state_names:
            init = self._initial[name]
            if isinstance(init, str):
                init = getattr(self, init)
                init = 0.0 if init is None else init  # v = v_reset under a soft reset (v_reset=None) starts at 0
            self._set_state(name, init.detach() if isinstance(init, torch.Tensor) else float(init))
        self._set_state("v_seq", None)

    def _set_state(self, name: str, value: Any) -> None:
        """Set a state (or v_seq). These are plain attributes, never parameters, buffers or modules (`__init__`
        refuses clashing state names), so eager calls skip nn.Module.__setattr__, whose checks (isinstance against
        Parameter in Python, three dict lookups) cost a fifth of a small layer's host time (three calls per
        forward with a reset: 40 of 213 thousand instructions, callgrind). torch.compile traces the usual path."""
        if torch.compiler.is_compiling():
            setattr(self, name, value)
        else:
            self.__dict__[name] = value

    def _state(self, name: str, x: torch.Tensor, shape: torch.Size) -> torch.Tensor | float:
        value = getattr(self, name)
        if not isinstance(value, torch.Tensor):  # a number after reset: the kernels start from it directly
            return float(value)
        if value.shape != shape:  # an initial value held by a broadcast parameter
            value = value.expand(shape).clone()
        return value if value.dtype == x.dtype else value.to(x.dtype)  # `to` parses its arguments even to do nothing

    # -- forward --------------------------------------------------------------------------------------
    def _params(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._param_names}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.step_mode == "m":
            return self.multi_step_forward(x)
        if self.step_mode == "s":
            return self.single_step_forward(x)
        raise ValueError(f"step_mode: expected 's' or 'm', got {self.step_mode!r}")

    def single_step_forward(self, x: torch.Tensor) -> torch.Tensor:
        states = [self._state(n, x, x.shape) for n in self.state_names]
        spike, new_states = F.single_step(self._spec_ref, x, *states, surrogate=self._surrogate_ref,
                                          detach_reset=self.detach_reset, backend=_BACKENDS[self.backend],
                                          **self._params())
        for name, value in zip(self.state_names, new_states):
            self._set_state(name, value)
        return spike

    def multi_step_forward(self, x_seq: torch.Tensor) -> torch.Tensor:
        if not isinstance(x_seq, torch.Tensor) or x_seq.dim() < 2:
            shape = tuple(x_seq.shape) if isinstance(x_seq, torch.Tensor) else type(x_seq).__name__
            raise ValueError(f"x_seq: step_mode 'm' expects a tensor of shape [T, *], got {shape}")
        states = [self._state(n, x_seq, x_seq.shape[1:]) for n in self.state_names]
        spikes, finals, seqs = F.multi_step(self._spec_ref, x_seq, *states, surrogate=self._surrogate_ref,
                                            detach_reset=self.detach_reset, store_state_seq=self.store_v_seq,
                                            backend=_BACKENDS[self.backend], **self._params())
        for name, value in zip(self.state_names, finals):
            self._set_state(name, value)
        if seqs is not None:
            self._set_state("v_seq", seqs[0])
        return spikes

    def extra_repr(self) -> str:
        params = []
        for name in self._param_names:
            value = getattr(self, name)
            if isinstance(value, torch.Tensor):
                kind = "Parameter" if isinstance(value, nn.Parameter) else "tensor"
                value = f"{kind}{list(value.shape)}" if value.numel() != 1 else f"{kind}({float(value):.4g})"
            params.append(f"{name}={value}")
        options = [f"{n}={v}" for n, v in self.spec.options]
        return ", ".join([f"spec={self.spec.name!r}", *params, *options, f"surrogate={self._surrogate!r}",
                          f"detach_reset={self.detach_reset}", f"step_mode={self.step_mode!r}",
                          f"store_v_seq={self.store_v_seq}", f"backend={self.backend!r}"])


def _common(surrogate_function, detach_reset, step_mode, backend, store_v_seq) -> dict[str, Any]:
    return {"surrogate_function": surrogate_function, "detach_reset": detach_reset, "step_mode": step_mode,
            "backend": backend, "store_v_seq": store_v_seq}


class IFNode(Neuron):
    def __init__(self, v_threshold: float = 1., v_reset: float | None = 0., surrogate_function: Any = SIGMOID,
                 detach_reset: bool = False, step_mode: str = "s", backend: str | None = None,
                 store_v_seq: bool = False):
        super().__init__("if", v_threshold=v_threshold, v_reset=v_reset,
                         **_common(surrogate_function, detach_reset, step_mode, backend, store_v_seq))


class LIFNode(Neuron):
    def __init__(self, tau: float = 2., decay_input: bool = True, v_threshold: float = 1.,
                 v_reset: float | None = 0., surrogate_function: Any = SIGMOID, detach_reset: bool = False,
                 step_mode: str = "s", backend: str | None = None, store_v_seq: bool = False):
        super().__init__("lif", tau=tau, v_threshold=v_threshold, v_reset=v_reset,
                         options={"decay_input": bool(decay_input)},
                         **_common(surrogate_function, detach_reset, step_mode, backend, store_v_seq))
        self.decay_input = bool(decay_input)


class ParametricLIFNode(Neuron):
    def __init__(self, init_tau: float = 2.0, decay_input: bool = True, v_threshold: float = 1.,
                 v_reset: float | None = 0., surrogate_function: Any = SIGMOID, detach_reset: bool = False,
                 step_mode: str = "s", backend: str | None = None, store_v_seq: bool = False):
        if not init_tau > 1:
            raise ValueError(f"init_tau: must be > 1 (1/tau = sigmoid(w) lies in (0, 1)), got {init_tau}")
        w = nn.Parameter(torch.tensor(-math.log(init_tau - 1.)))
        super().__init__("parametric_lif", w=w, v_threshold=v_threshold, v_reset=v_reset,
                         options={"decay_input": bool(decay_input)},
                         **_common(surrogate_function, detach_reset, step_mode, backend, store_v_seq))
        self.decay_input = bool(decay_input)


class QIFNode(Neuron):
    def __init__(self, tau: float = 2., v_c: float = 0.8, a0: float = 1., v_threshold: float = 1.,
                 v_rest: float = 0., v_reset: float | None = -0.1, surrogate_function: Any = SIGMOID,
                 detach_reset: bool = False, step_mode: str = "s", backend: str | None = None,
                 store_v_seq: bool = False):
        super().__init__("qif", tau=tau, v_c=v_c, a0=a0, v_threshold=v_threshold, v_rest=v_rest, v_reset=v_reset,
                         **_common(surrogate_function, detach_reset, step_mode, backend, store_v_seq))


class EIFNode(Neuron):
    def __init__(self, tau: float = 2., delta_T: float = 1., theta_rh: float = .8, v_threshold: float = 1.,
                 v_rest: float = 0., v_reset: float | None = -0.1, surrogate_function: Any = SIGMOID,
                 detach_reset: bool = False, step_mode: str = "s", backend: str | None = None,
                 store_v_seq: bool = False):
        super().__init__("eif", tau=tau, delta_T=delta_T, theta_rh=theta_rh, v_threshold=v_threshold,
                         v_rest=v_rest, v_reset=v_reset,
                         **_common(surrogate_function, detach_reset, step_mode, backend, store_v_seq))


class IzhikevichNode(Neuron):
    def __init__(self, tau: float = 2., v_c: float = 0.8, a0: float = 1., v_threshold: float = 1.,
                 v_reset: float | None = 0., v_rest: float = -0.1, w_rest: float = 0., tau_w: float = 2.,
                 a: float = 0., b: float = 0., surrogate_function: Any = SIGMOID, detach_reset: bool = False,
                 step_mode: str = "s", backend: str | None = None, store_v_seq: bool = False):
        super().__init__("izhikevich", tau=tau, v_c=v_c, a0=a0, v_threshold=v_threshold, v_reset=v_reset,
                         v_rest=v_rest, tau_w=tau_w, a=a, b=b, initial={"w": w_rest},
                         **_common(surrogate_function, detach_reset, step_mode, backend, store_v_seq))
        self.w_rest = w_rest


class AdExNode(Neuron):
    def __init__(self, tau: float = 2., delta_T: float = 1., theta_rh: float = .8, v_threshold: float = 1.,
                 v_rest: float = 0., v_reset: float | None = -0.1, R: float = 1., tau_w: float = 2.,
                 a: float = 0.1, b: float = 0.1, w_rest: float = 0., surrogate_function: Any = SIGMOID,
                 detach_reset: bool = False, step_mode: str = "s", backend: str | None = None,
                 store_v_seq: bool = False):
        super().__init__("adex", tau=tau, delta_T=delta_T, theta_rh=theta_rh, v_threshold=v_threshold,
                         v_rest=v_rest, v_reset=v_reset, R=R, tau_w=tau_w, a=a, b=b, initial={"w": w_rest},
                         **_common(surrogate_function, detach_reset, step_mode, backend, store_v_seq))
        self.w_rest = w_rest


class ALIFNode(Neuron):
    def __init__(self, tau: float = 2., tau_a: float = 20., beta: float = 0.2, v_threshold: float = 1.,
                 v_reset: float | None = 0., surrogate_function: Any = SIGMOID, detach_reset: bool = False,
                 step_mode: str = "s", backend: str | None = None, store_v_seq: bool = False):
        super().__init__("alif", tau=tau, tau_a=tau_a, beta=beta, v_threshold=v_threshold, v_reset=v_reset,
                         **_common(surrogate_function, detach_reset, step_mode, backend, store_v_seq))
