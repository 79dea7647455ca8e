"""SpikingJelly 2.0's neurons whose output is not (only) the spike, or whose reset the reset rules cannot say,
with its names, constructor signatures (positional order included) and defaults; `backend` comes last. Each is
a `Neuron` of a shipped spec (see docs/semantics.md):

| class                  | spec             | notes                                                              |
|------------------------|------------------|--------------------------------------------------------------------|
| `NonSpikingIFNode`     | `nonspiking_if`  | multi-step only; starts at v = 0 every call; output: the membrane  |
| `NonSpikingLIFNode`    | `nonspiking_lif` | as NonSpikingIFNode                                                |
| `LIAFNode`             | `liaf`           | output act(h - v_threshold) (or act(h)); the spike only resets     |
| `ComplementaryLIFNode` | `clif`           | states v_charged (the charge), v, m; default surrogate Rect(1)     |

The non-spiking nodes decode the membrane sequence as SpikingJelly's `decode` says: None gives the list of the
steps' membranes (SpikingJelly returns a list), 'max-mem', 'max-abs-mem', 'mean-mem' and 'last_mem' one tensor.
An unknown `decode` is refused (SpikingJelly returns the list).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..base.switches import check_switches
from ..call import functional as F
from .arguments import BACKENDS, checked_attribute, require_steps
from .layer_call import read_params, start_states, step_inputs, store_states, sync_surrogate
from .memory import MultiStepOnly
from .neuron import SIGMOID, Neuron, option_attribute
from .spikingjelly import _common, require_tau
from .spikingjelly_more import RECT

__all__ = ["NonSpikingIFNode", "NonSpikingLIFNode", "LIAFNode", "ComplementaryLIFNode"]


def _max_abs(v_seq: torch.Tensor) -> torch.Tensor:
    high, low = v_seq.max(0).values, v_seq.min(0).values
    return high * (high.abs() > low.abs()) + low * (high.abs() <= low.abs())


def _checked_decode(decode: Any) -> str | None:
    if not isinstance(decode, (str, type(None))) or decode not in DECODES:
        raise ValueError(f"decode: expected one of {list(DECODES)}, got {decode!r}")
    return decode


DECODES: Mapping[str | None, Callable[[torch.Tensor], Any]] = {
    None: lambda v_seq: list(v_seq.unbind(0)),
    "max-mem": lambda v_seq: v_seq.max(0).values,
    "max-abs-mem": _max_abs,
    "mean-mem": lambda v_seq: v_seq.mean(0),
    "last_mem": lambda v_seq: v_seq[-1],
}


class _NonSpiking(MultiStepOnly, Neuron):
    """A non-spiking node of SpikingJelly: multi-step (setting step_mode to 's' is refused, as SpikingJelly's
    MultiStepModule does), the membrane from 0 at every call, decoded."""

    def __init__(self, spec: str, decode: str | None, backend: str | None, **params: Any):
        _checked_decode(decode)
        super().__init__(spec, step_mode="m", backend=backend, **params)
        self.decode = decode

    decode = checked_attribute("decode", _checked_decode, "How the membranes are decoded (`DECODES`)")

    def forward(self, *inputs: torch.Tensor) -> Any:
        require_steps(self, inputs[0] if inputs else None)
        self.reset()  # SpikingJelly's non-spiking nodes start every sequence at v = 0
        return DECODES[self.decode](self.multi_step_forward(*inputs))


class NonSpikingIFNode(_NonSpiking):
    def __init__(self, decode: str | None = None, backend: str | None = None):
        super().__init__("nonspiking_if", decode, backend)


class NonSpikingLIFNode(_NonSpiking):
    def __init__(self, tau: float = 2., decode: str | None = None, backend: str | None = None):
        super().__init__("nonspiking_lif", decode, backend, tau=tau)


class LIAFNode(Neuron):
    decay_input = option_attribute("decay_input")
    threshold_related = option_attribute("threshold_related")

    def __init__(self, act: Callable[[torch.Tensor], torch.Tensor], threshold_related: bool, tau: float = 2.,
                 decay_input: bool = True, v_threshold: float = 1., v_reset: float | None = 0.,
                 surrogate_function: Any = SIGMOID, detach_reset: bool = False, step_mode: str = "s",
                 store_v_seq: bool = False, backend: str | None = None):
        if not callable(act):
            raise TypeError(f"act: expected a callable (an activation such as torch.nn.ReLU()), got "
                            f"{type(act).__name__}")
        require_tau(tau)
        super().__init__("liaf", tau=tau, v_threshold=v_threshold, v_reset=v_reset,
                         options={"decay_input": bool(decay_input), "threshold_related": bool(threshold_related)},
                         **_common(surrogate_function, detach_reset, step_mode, store_v_seq, backend))
        self.act = act

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.act(super().forward(*inputs))

    def functional_forward(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...],
                           **kwargs: Any) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
        (output,), new_states = super().functional_forward(inputs, states, **kwargs)
        return (self.act(output),), new_states


class ComplementaryLIFNode(Neuron):
    state_seqs: list[torch.Tensor] | None  # [v_seq, m_seq] of the last multi-step call, where store_state_seqs

    def __init__(self, tau: float = 2., v_threshold: float = 1., surrogate_function: Any = RECT,
                 step_mode: str = "s", store_state_seqs: bool = False, backend: str | None = None):
        require_tau(tau)
        super().__init__("clif", tau=tau, v_threshold=v_threshold,
                         **_common(surrogate_function, False, step_mode, False, backend))
        self.store_state_seqs = store_state_seqs

    @property
    def store_state_seqs(self) -> bool:
        return self.__dict__["_store_state_seqs"]

    @store_state_seqs.setter
    def store_state_seqs(self, value: bool) -> None:
        check_switches(store_state_seqs=value)  # a word such as "no" is true
        self.__dict__["_store_state_seqs"] = value
        self.state_seqs = None

    def reset(self) -> None:
        super().reset()
        self.state_seqs = None

    def multi_step_forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        if not self.store_state_seqs:
            return super().multi_step_forward(*inputs)
        sync_surrogate(self)
        x_seq = step_inputs(self, inputs, 2)[1]
        compiling = torch.compiler.is_compiling()
        spikes, finals, seqs = F.multi_step(self._spec_ref, x_seq, *start_states(self, x_seq, 1, compiling),
                                            surrogate=self._surrogate_ref, store_state_seq=True,
                                            backend=BACKENDS[self.backend], **read_params(self, compiling))
        assert finals is not None and seqs is not None
        store_states(self, self.state_names, finals, compiling)
        by_name = dict(zip(self.state_names, seqs))
        self.state_seqs = [by_name["v"], by_name["m"]]
        return spikes
