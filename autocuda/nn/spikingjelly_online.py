"""SpikingJelly 2.0's LIF nodes for online training (neuron/online_learning.py): OTTT (Xiao et al. 2022, online
training through time) and SLTT (Meng et al. 2023, spatial learning through time). Their point is memory: in
training each step starts from the membrane *detached*, so backward never goes back in time and a step's graph
is freed once its loss is back-propagated; OTTT also keeps a presynaptic trace (trace ← trace·(1 - 1/τ) + s, without
gradient) that its layers use for the weights' gradient, and returns [spike, trace] in training.

Each is our `LIFNode` (the `lif` spec's single-step kernels on CUDA, the reference on the CPU) called on the
detached membrane; in evaluation (`.eval()`) the membrane is not detached and the spike is SpikingJelly's
heaviside: no gradient through the spike (the output is detached and the reset sees a detached spike).
As SpikingJelly's, single-step only; setting `step_mode` to 'm' is refused here (SpikingJelly's takes it and then
runs the plain LIF's multi-step path, without the detaching or the trace).
"""
from __future__ import annotations

from typing import Any

import torch

from .layer_call import append_v_seq, store_states
from .neuron import SIGMOID, Neuron
from .spikingjelly import LIFNode

__all__ = ["OTTTLIFNode", "SLTTLIFNode"]


class _OnlineLIFNode(LIFNode):
    """A LIF node whose training steps start from the detached membrane (single steps only)."""

    def __init__(self, tau: float, decay_input: bool, v_threshold: float, v_reset: float | None,
                 surrogate_function: Any, detach_reset: bool, step_mode: str, store_v_seq: bool,
                 backend: str | None):
        super().__init__(tau, decay_input, v_threshold, v_reset, surrogate_function, detach_reset, step_mode,
                         store_v_seq, backend)

    @property
    def step_mode(self) -> str:
        return "s"

    @step_mode.setter
    def step_mode(self, value: str) -> None:
        if value != "s":
            raise ValueError(f"step_mode: {type(self).__name__} trains online, one step at a time: only 's' "
                             f"(SpikingJelly asserts it), got {value!r}")

    def supported_step_mode(self) -> tuple[str, ...]:
        return ("s",)

    def forward(self, x: torch.Tensor) -> Any:  # type: ignore[override]
        return self.single_step_forward(x)

    def single_step_forward(self, x: torch.Tensor) -> Any:  # type: ignore[override]
        """A training step is LIFNode's step (its keyed call where it runs) from the detached membrane, then
        `online_outputs`; an evaluation step runs through `single_step_functional_forward` (SpikingJelly's
        MemoryModule path). The outputs as a list where there are several (OTTT's [spike, trace] in training)."""
        compiling = torch.compiler.is_compiling()
        if self.training:
            d, name = self.__dict__, self._state_names[0]
            v = d[name] if not compiling and name in d else getattr(self, name)
            if isinstance(v, torch.Tensor) and v.requires_grad:
                store_states(self, (name,), (v.detach(),), compiling)
            return self.online_outputs(Neuron.single_step_forward(self, x), compiling)
        names = self._memory_names
        states = self.materialize_states((x,), tuple(getattr(self, n) for n in names), "s")
        outputs, new_states = self.single_step_functional_forward((x,), states)
        store_states(self, names, new_states, compiling)
        if self.store_v_seq and isinstance(new_states[0], torch.Tensor):
            append_v_seq(self, new_states[0], compiling)
        return list(outputs) if len(outputs) > 1 else outputs[0]

    def online_outputs(self, spike: torch.Tensor, compiling: bool) -> Any:
        """A training step's outputs from its spike (the states it keeps besides the membrane updated)."""
        return spike

    def multi_step_forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        raise ValueError(f"step_mode: {type(self).__name__} runs single steps only ('s')")

    def single_step_functional_forward(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...],
                                       **kwargs: Any) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
        """One step from `states`: in training from the detached membrane; in evaluation the spike carries no
        gradient (heaviside: the output detached, the reset's spike detached)."""
        v, rest = states[0], tuple(states[1:])
        if self.training:
            v = v.detach() if isinstance(v, torch.Tensor) else v
            return Neuron.single_step_functional_forward(self, inputs, (v, *rest))
        detach_reset = self.detach_reset
        self.detach_reset = True
        try:
            (spike,), new_states = Neuron.single_step_functional_forward(self, inputs, (v, *rest))
        finally:
            self.detach_reset = detach_reset
        return (spike.detach(),), new_states


class OTTTLIFNode(_OnlineLIFNode):
    """`OTTTLIFNode(tau=2., decay_input=False, v_threshold=1., v_reset=None, surrogate_function=Sigmoid(),
    detach_reset=True, step_mode='s', store_v_seq=False)`: memories v and trace; in training a step returns
    [spike, trace]."""

    def __init__(self, tau: float = 2., decay_input: bool = False, v_threshold: float = 1.,
                 v_reset: float | None = None, surrogate_function: Any = SIGMOID, detach_reset: bool = True,
                 step_mode: str = "s", store_v_seq: bool = False, backend: str | None = None):
        super().__init__(tau, decay_input, v_threshold, v_reset, surrogate_function, detach_reset, step_mode,
                         store_v_seq, backend)
        self.register_memory("trace", None)

    def materialize_states(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...],
                           step_mode: str) -> tuple[Any, ...]:
        """As LIFNode's, and in training a trace of zeros where there is none yet or it has another shape than the
        input (a new batch size starts it afresh, as the membrane)."""
        v, trace = super().materialize_states(inputs, states, step_mode)
        if self.training:
            trace = self.fitted_trace(trace, inputs[0])
        return v, trace

    @staticmethod
    def fitted_trace(trace: Any, like: torch.Tensor) -> Any:
        """`trace`, or zeros like `like` where there is none or it is a tensor of another shape (a new input shape
        starts the trace afresh, as it does the membrane, instead of broadcasting another sample's trace)."""
        if trace is None or (isinstance(trace, torch.Tensor) and trace.shape != like.shape):
            return torch.zeros_like(like)
        return trace

    def online_outputs(self, spike: torch.Tensor, compiling: bool) -> Any:
        """[spike, trace], the trace (zeros where there is none yet, or of another shape) tracking the spike."""
        trace = self.track_trace(spike, self.fitted_trace(self.trace, spike), self.tau)
        store_states(self, ("trace",), (trace,), compiling)
        return [spike, trace]

    @staticmethod
    def track_trace(spike: torch.Tensor, trace: torch.Tensor, tau: Any) -> torch.Tensor:
        """trace·(1 - 1/τ) + spike, without gradient."""
        with torch.no_grad():
            return trace * (1.0 - 1.0 / tau) + spike

    def single_step_functional_forward(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...],
                                       **kwargs: Any) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
        (spike,), (v, trace) = super().single_step_functional_forward(inputs, states, **kwargs)
        if not self.training:
            return (spike,), (v, trace)
        trace = self.track_trace(spike, trace, self.tau)
        return (spike, trace), (v, trace)


class SLTTLIFNode(_OnlineLIFNode):
    """`SLTTLIFNode(tau=2., decay_input=True, v_threshold=1., v_reset=0., surrogate_function=Sigmoid(),
    detach_reset=True, step_mode='s', store_v_seq=False)`."""

    def __init__(self, tau: float = 2., decay_input: bool = True, v_threshold: float = 1.,
                 v_reset: float | None = 0., surrogate_function: Any = SIGMOID, detach_reset: bool = True,
                 step_mode: str = "s", store_v_seq: bool = False, backend: str | None = None):
        super().__init__(tau, decay_input, v_threshold, v_reset, surrogate_function, detach_reset, step_mode,
                         store_v_seq, backend)
