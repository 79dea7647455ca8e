"""SpikingJelly 2.0's neuron base classes, for code that subclasses them: `BaseNode`, `SimpleBaseNode`,
`NonSpikingBaseNode` and `AdaptBaseNode`, with SpikingJelly's constructors and subclassing contracts, in torch.

What a subclass of SpikingJelly 2.0's classes writes, and what it gets here as there:

- `BaseNode` (and `AdaptBaseNode`): the step as `single_step_functional_forward(inputs, states, **kwargs)`, which
  returns `((spike,), new_states)` from explicit states (the membrane `v` first, then any registered with
  `register_memory`); the base materialises the states (a number becomes a tensor of the input's shape, a tensor
  of another shape starts afresh), runs single steps or loops them over a sequence, keeps `v_seq` with
  `store_v_seq`, and stores the new states. `apply_hard_reset` and `apply_soft_reset` are SpikingJelly's reset
  formulas. AdaptBaseNode adds the memory `w` and `neuronal_adaptation()`.
- `SimpleBaseNode`: the step as `neuronal_charge(x)` (setting `self.v`), with SpikingJelly's `neuronal_fire`
  (`surrogate_function(v - v_threshold)`) and `neuronal_reset(spike)`.
- `NonSpikingBaseNode`: `neuronal_charge(x)` over a sequence from v = 0, decoded as `decode` says.

The layers autocuda ships run specs on generated kernels (`autocuda.nn.Neuron`) and do not derive from these: a
subclass here runs the torch code it is given. They are SpikingJelly's `base.MemoryModule`s where SpikingJelly is
installed (its free functions find them), as every layer here is.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from .arguments import TakesSurrogate, refuse_script, require_steps
from .memory import Memories, MemoryBase, MultiStepOnly
from .neuron import SIGMOID
from .spikingjelly_variants import DECODES

__all__ = ["BaseNode", "SimpleBaseNode", "NonSpikingBaseNode", "AdaptBaseNode"]


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite float, got {value!r}")
    return float(value)


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name}: expected True or False, got {value!r}")
    return value


def own_surrogate(surrogate_function: Any) -> Any:
    """The layer's surrogate: a copy of a frozen one (the shared default), the object given otherwise."""
    frozen = getattr(surrogate_function, "frozen", None)
    if frozen is not None and frozen() is surrogate_function:
        return surrogate_function.copy()
    return surrogate_function


def _state_like(value: Any, x: torch.Tensor, fresh: float) -> Any:
    """A state for a step on x: a number as a tensor of x's shape, a tensor of another shape afresh (`fresh`), a
    tensor in x's dtype and device."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return torch.full_like(x, float(value))
    if isinstance(value, torch.Tensor):
        if value.shape != x.shape:
            return torch.full_like(x, fresh)
        if value.dtype != x.dtype or value.device != x.device:
            return value.to(dtype=x.dtype, device=x.device)
    return value


class _MemoryNode(TakesSurrogate, Memories, MemoryBase):
    """SpikingJelly's `MemoryModule` calls: single and multi steps from the memories, with keyword arguments
    passed on to the functional step, and `functional_forward` from explicit states."""

    v: Any  # the membrane: a number until the first step, then a tensor

    def _start(self, step_mode: str, memories: dict[str, Any]) -> None:
        nn.Module.__init__(self)  # not MemoryModule's (where it is the base): it sets the dict this class lacks
        self.step_mode = step_mode
        self._start_memories(memories)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return (self.multi_step_forward if self.step_mode == "m" else self.single_step_forward)(*args, **kwargs)

    def materialize_states(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...],
                           step_mode: str) -> tuple[Any, ...]:
        return states

    def single_step_forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return self._step_call((x, *args), "s", self.single_step_functional_forward, kwargs)

    def multi_step_forward(self, x_seq: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        require_steps(self, x_seq)
        return self._step_call((x_seq, *args), "m", self.multi_step_functional_forward, kwargs)

    def _step_call(self, inputs: tuple[torch.Tensor, ...], step_mode: str, functional: Any,
                   kwargs: dict[str, Any]) -> Any:
        """A call in `step_mode` through its functional forward from the layer's memories, which keep the new states."""
        states = self.materialize_states(inputs, self._memory_values(), step_mode)
        outputs, states = functional(inputs, states, **kwargs)
        self._keep(states)
        return outputs[0] if len(outputs) == 1 else outputs

    def single_step_functional_forward(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...],
                                       **kwargs: Any) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
        raise NotImplementedError(f"{type(self).__name__} must implement single_step_functional_forward.")

    def multi_step_functional_forward(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...],
                                      **kwargs: Any) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
        steps = []
        for t in range(inputs[0].shape[0]):
            outputs, states = self.single_step_functional_forward(tuple(u[t] for u in inputs), states, **kwargs)
            steps.append(outputs)
        return tuple(torch.stack(seq) for seq in zip(*steps)), states

    def functional_forward(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...],
                           **kwargs: Any) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
        """A call in the layer's step mode from explicit `states`; the layer's own memories are not touched."""
        states = self.materialize_states(tuple(inputs), tuple(states), self.step_mode)
        if self.step_mode == "m":
            return self.multi_step_functional_forward(tuple(inputs), states, **kwargs)
        return self.single_step_functional_forward(tuple(inputs), states, **kwargs)

    def _memory_values(self) -> tuple[Any, ...]:
        return tuple(value for _, value in self.named_memories())

    def _keep(self, states: tuple[Any, ...]) -> None:
        for name, value in zip(self._memory_names, states):
            self.__dict__[name] = value


class BaseNode(_MemoryNode):
    """`BaseNode(v_threshold=1., v_reset=0., surrogate_function=Sigmoid(), detach_reset=False, step_mode='s',
    store_v_seq=False)`: a spiking neuron whose subclass writes `single_step_functional_forward`."""

    v_threshold: Any  # a float (a subclass may make it a tensor: MPBN's folded threshold)

    def __init__(self, v_threshold: float = 1., v_reset: float | None = 0., surrogate_function: Any = SIGMOID,
                 detach_reset: bool = False, step_mode: str = "s", store_v_seq: bool = False):
        if v_reset is not None:
            _number("v_reset", v_reset)
        _number("v_threshold", v_threshold)
        _flag("detach_reset", detach_reset)
        self._start(step_mode, {"v": 0.0 if v_reset is None else float(v_reset)})
        self.v_threshold, self.v_reset = float(v_threshold), None if v_reset is None else float(v_reset)
        self.detach_reset = detach_reset
        self.surrogate_function = own_surrogate(surrogate_function)
        self.store_v_seq = _flag("store_v_seq", store_v_seq)

    @property
    def store_v_seq(self) -> bool:
        return self.__dict__["_store_v_seq"]

    @store_v_seq.setter
    def store_v_seq(self, value: bool) -> None:
        self.__dict__["_store_v_seq"] = value
        self.__dict__["v_seq"] = None

    def reset(self) -> None:
        super().reset()
        self.__dict__["v_seq"] = None

    def detach(self) -> None:
        super().detach()
        if isinstance(self.__dict__.get("v_seq"), torch.Tensor):
            self.__dict__["v_seq"] = self.__dict__["v_seq"].detach()

    @staticmethod
    def apply_hard_reset(v: torch.Tensor, spike: torch.Tensor, v_reset: float) -> torch.Tensor:
        return (1.0 - spike) * v + spike * v_reset

    @staticmethod
    def apply_soft_reset(v: torch.Tensor, spike: torch.Tensor, v_threshold: float) -> torch.Tensor:
        return v - spike * v_threshold

    def materialize_states(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...],
                           step_mode: str) -> tuple[Any, ...]:
        x = inputs[0][0] if step_mode == "m" else inputs[0]
        fresh = 0.0 if self.v_reset is None else self.v_reset
        return (_state_like(states[0], x, fresh), *states[1:])

    def single_step_forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        out = super().single_step_forward(x, *args, **kwargs)
        v = self.__dict__.get("v")
        if self.store_v_seq and isinstance(v, torch.Tensor):  # appended until a reset, restarted on a new shape
            kept = self.__dict__.get("v_seq")
            if isinstance(kept, torch.Tensor) and (kept.shape[1:], kept.dtype, kept.device) == (
                    v.shape, v.dtype, v.device):
                self.__dict__["v_seq"] = torch.cat((kept, v.unsqueeze(0)))
            else:
                self.__dict__["v_seq"] = v.unsqueeze(0).clone()
        return out

    def multi_step_forward(self, x_seq: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if not self.store_v_seq:
            return super().multi_step_forward(x_seq, *args, **kwargs)
        inputs = (x_seq, *args)
        states = self.materialize_states(inputs, self._memory_values(), "m")
        steps, voltages = [], []
        for t in range(x_seq.shape[0]):
            outputs, states = self.single_step_functional_forward(tuple(u[t] for u in inputs), states, **kwargs)
            steps.append(outputs)
            voltages.append(states[0])
        self._keep(states)
        self.__dict__["v_seq"] = torch.stack(voltages)
        outputs = tuple(torch.stack(seq) for seq in zip(*steps))
        return outputs[0] if len(outputs) == 1 else outputs

    def extra_repr(self) -> str:
        return (f"v_threshold={self.v_threshold}, v_reset={self.v_reset}, detach_reset={self.detach_reset}, "
                f"step_mode={self.step_mode}")


class AdaptBaseNode(BaseNode):
    """`AdaptBaseNode(v_threshold=1., v_reset=0., v_rest=0., w_rest=0., tau_w=2., a=0., b=0.,
    surrogate_function=Sigmoid(), detach_reset=False, step_mode='s', store_v_seq=False)`: a BaseNode with an
    adaptation current `w` (a memory, starting at w_rest)."""

    w: Any

    def __init__(self, v_threshold: float = 1., v_reset: float | None = 0., v_rest: float = 0., w_rest: float = 0.,
                 tau_w: float = 2., a: float = 0., b: float = 0., surrogate_function: Any = SIGMOID,
                 detach_reset: bool = False, step_mode: str = "s", store_v_seq: bool = False):
        numbers = {name: _number(name, value) for name, value in
                   (("w_rest", w_rest), ("v_rest", v_rest), ("tau_w", tau_w), ("a", a), ("b", b))}
        super().__init__(v_threshold, v_reset, surrogate_function, detach_reset, step_mode, store_v_seq)
        self.register_memory("w", numbers["w_rest"])
        self.w_rest, self.v_rest, self.tau_w = numbers["w_rest"], numbers["v_rest"], numbers["tau_w"]
        self.a, self.b = numbers["a"], numbers["b"]

    @staticmethod
    def jit_neuronal_adaptation(w: torch.Tensor, tau_w: float, a: float, v_rest: float,
                                v: torch.Tensor) -> torch.Tensor:
        return w + 1.0 / tau_w * (a * (v - v_rest) - w)

    def neuronal_adaptation(self) -> None:
        self.w = self.jit_neuronal_adaptation(self.w, self.tau_w, self.a, self.v_rest, self.v)

    def materialize_states(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...],
                           step_mode: str) -> tuple[Any, ...]:
        states = super().materialize_states(inputs, states, step_mode)
        return (*states[:-1], _state_like(states[-1], states[0], self.w_rest))

    def extra_repr(self) -> str:
        return (super().extra_repr() + f", v_rest={self.v_rest}, w_rest={self.w_rest}, tau_w={self.tau_w}, "
                                       f"a={self.a}, b={self.b}")


class SimpleBaseNode(_MemoryNode):
    """`SimpleBaseNode(v_threshold=1., v_reset=0., surrogate_function=Sigmoid(), detach_reset=False,
    step_mode='s')`: a subclass writes `neuronal_charge(x)`, which sets `self.v` (a number until the first step,
    as SpikingJelly's: the charge broadcasts it)."""

    def __init__(self, v_threshold: float = 1., v_reset: float | None = 0., surrogate_function: Any = SIGMOID,
                 detach_reset: bool = False, step_mode: str = "s"):
        self._start(step_mode, {"v": 0.0})
        self.v_threshold, self.v_reset = v_threshold, v_reset
        self.surrogate_function = own_surrogate(surrogate_function)
        self.detach_reset = detach_reset

    def single_step_forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        self.neuronal_charge(x)
        spike = self.neuronal_fire()
        self.neuronal_reset(spike)
        return spike

    def multi_step_forward(self, x_seq: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        require_steps(self, x_seq)
        return torch.stack([self.single_step_forward(x) for x in x_seq])

    def neuronal_charge(self, x: torch.Tensor) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement neuronal_charge.")

    def neuronal_fire(self) -> torch.Tensor:
        spike: torch.Tensor = self.surrogate_function(self.v - self.v_threshold)
        return spike

    def neuronal_reset(self, spike: torch.Tensor) -> None:
        spike_d = spike.detach() if self.detach_reset else spike
        if self.v_reset is None:
            self.v = self.v - self.v_threshold * spike_d
        else:
            self.v = spike_d * self.v_reset + (1.0 - spike_d) * self.v


class NonSpikingBaseNode(MultiStepOnly, nn.Module):
    """`NonSpikingBaseNode(decode=None)`: multi-step; a subclass writes `neuronal_charge(x)` (setting
    `self.v`); each call starts from v = 0 and returns the membrane sequence decoded by `decode`. An unknown
    decode is refused (SpikingJelly's returns the list). `step_mode` is 'm', another refused (a SpikingJelly
    `MultiStepModule` where SpikingJelly is installed, as theirs)."""

    v: torch.Tensor
    __prepare_scriptable__ = refuse_script  # torch.jit.script: refused by name, as the other layers

    def __init__(self, decode: str | None = None):
        if decode not in DECODES:
            raise ValueError(f"decode: expected one of {list(DECODES)}, got {decode!r}")
        super().__init__()
        self.decode = decode

    def neuronal_charge(self, x: torch.Tensor) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement neuronal_charge.")

    def forward(self, x_seq: torch.Tensor) -> Any:
        require_steps(self, x_seq)
        self.v = torch.zeros_like(x_seq[0].detach())
        v_seq = []
        for x in x_seq:
            self.neuronal_charge(x)
            v_seq.append(self.v)
        return DECODES[self.decode](torch.stack(v_seq))
