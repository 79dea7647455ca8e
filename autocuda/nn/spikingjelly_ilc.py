"""SpikingJelly 2.0's neurons with inter-layer connections (neuron/inter_layer_connection.py; the population-coded
decoders of spiking actor networks): after each step, the spikes of each action's population of `dec_pop_dim`
neurons are mixed by a learned dense map of their own (SpikingJelly's grouped `nn.Conv1d`, `conn`) into the next
step's input of that population.

The feedback is matrix work between steps, so a call runs step by step: each step is one single-step call of a
shipped spec (its kernels on CUDA, the reference on the CPU), then `conn` with torch:

| class            | spec                                  |
|------------------|---------------------------------------|
| `ILCIFNode`      | `if`                                  |
| `ILCLIFNode`     | `cuba_lif_discrete` with c_decay = 0  |
| `ILCCUBALIFNode` | `cuba_lif_discrete`                   |

As SpikingJelly's: multi-step only (`x_seq` [T, *, act_dim * dec_pop_dim]), every call starts from the initial
states, the default surrogate is Rect(alpha=1), `v_threshold` must be a float and `v_reset` a float or None.
Unlike SpikingJelly's, a call leaves `x_seq` as it is (SpikingJelly adds the feedback into the caller's tensor),
and `v_reset=None` is a soft reset from v = 0 (SpikingJelly's fills v with None and fails).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .arguments import fixed_at_construction, has_hooks, require_steps
from .memory import MultiStepOnly
from .neuron import Neuron
from .spikingjelly_more import RECT

__all__ = ["ILCBaseNode", "ILCIFNode", "ILCLIFNode", "ILCCUBALIFNode", "population_feedback", "check_float",
           "check_size"]


def check_float(name: str, value: Any, none: bool = False) -> None:
    """SpikingJelly's `assert isinstance(value, float)` (or None, where `none`), as a ValueError naming it."""
    if not (isinstance(value, float) or (none and value is None)):
        raise ValueError(f"{name}: must be a float{' or None' if none else ''} (as SpikingJelly asserts), got "
                         f"{value!r}")


def check_size(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected a whole number >= 1, got {value!r}")
    return value


def population_connection(act_dim: int, dec_pop_dim: int) -> nn.Conv1d:
    """SpikingJelly's `conn`: per action, a dense [dec_pop_dim, dec_pop_dim] map and a bias (a grouped Conv1d whose
    kernel spans the population), initialised as torch initialises that Conv1d."""
    return nn.Conv1d(act_dim, act_dim * dec_pop_dim, dec_pop_dim, groups=act_dim)


def _per_action_map(conn: Any, act_dim: int, dec_pop_dim: int) -> bool:
    """Whether `conn` is the grouped Conv1d `population_connection` makes (one dense map per action), without hooks
    (SpikingJelly calls conn, so its hooks run: a forward hook, weight_norm's pre-hook computing the weight)."""
    return type(conn) is nn.Conv1d and not has_hooks(conn) and conn.in_channels == act_dim and conn.groups == act_dim \
        and conn.out_channels == act_dim * dec_pop_dim and conn.kernel_size == (dec_pop_dim,) \
        and conn.stride == (1,) and conn.padding == (0,) and conn.dilation == (1,) and conn.padding_mode == "zeros"


def population_feedback(conn: nn.Conv1d, spike: torch.Tensor, act_dim: int, dec_pop_dim: int) -> torch.Tensor:
    """The next step's added input: each population's spikes through its own map, in the spike's shape and dtype.
    `conn`'s grouped convolution, whose kernel spans the population, is a matrix product per action: taken as one
    batched product (`einsum`) with conn's weight and bias, as cheap as the spikes' traffic where cuDNN's grouped
    convolution of a few channels over a long batch is not. The map runs in `conn`'s dtype: spikes of another dtype
    (float32 where a noisy node added its float32 noise to a half-precision input) are cast to it, where
    SpikingJelly's conn raises on the mismatch."""
    populations = spike.to(conn.weight.dtype).reshape(-1, act_dim, dec_pop_dim)
    if not _per_action_map(conn, act_dim, dec_pop_dim):  # a conn a user changed: as it is
        return conn(populations).reshape(spike.shape).to(spike.dtype)
    weight = conn.weight.view(act_dim, dec_pop_dim, dec_pop_dim)  # [action, out neuron, in neuron]
    mixed = torch.einsum("baj,aij->bai", populations, weight)
    if conn.bias is not None:
        mixed = mixed + conn.bias.view(act_dim, dec_pop_dim)
    return mixed.reshape(spike.shape).to(spike.dtype)


def check_population_input(layer: nn.Module, x_seq: Any, steps: int | None = None) -> None:
    """x_seq must be [T, *, act_dim * dec_pop_dim] (with T = `steps` where the layer fixes it)."""
    name = type(layer).__name__
    if not isinstance(x_seq, torch.Tensor):
        raise TypeError(f"{name}: x_seq: expected a tensor [T, *, {layer.num_node}], got {type(x_seq).__name__}")
    if x_seq.dim() < 2 or x_seq.shape[-1] != layer.num_node or (steps is not None and x_seq.shape[0] != steps):
        t = "T" if steps is None else f"T = {steps}"
        raise ValueError(f"{name}: x_seq: expected shape [{t}, *, act_dim * dec_pop_dim = {layer.num_node}], got "
                         f"{tuple(x_seq.shape)}")
    require_steps(layer, x_seq)


POPULATION_FOLLOWS = "the feedback connection's shape follows it"


class ILCBaseNode(MultiStepOnly, Neuron):
    """`ILCBaseNode(act_dim, dec_pop_dim, v_threshold=1., v_reset=0., surrogate_function=Rect())`: the base of the
    ILC nodes (SpikingJelly's leaves the charge abstract); a subclass names its spec in `SPEC`."""

    SPEC: str | None = None
    act_dim = fixed_at_construction("act_dim", POPULATION_FOLLOWS)
    dec_pop_dim = fixed_at_construction("dec_pop_dim", POPULATION_FOLLOWS)
    out_pop_dim = fixed_at_construction("out_pop_dim", POPULATION_FOLLOWS)

    def __init__(self, act_dim: int, dec_pop_dim: int, v_threshold: float = 1., v_reset: float | None = 0.,
                 surrogate_function: Any = RECT, backend: str | None = None, **spec_params: Any):
        if self.SPEC is None:
            raise TypeError(f"{type(self).__name__} is a base class (its charge is abstract): use ILCIFNode, "
                            "ILCLIFNode or ILCCUBALIFNode")
        check_float("v_reset", v_reset, none=True)
        check_float("v_threshold", v_threshold)
        check_size("act_dim", act_dim)
        check_size("dec_pop_dim", dec_pop_dim)
        super().__init__(self.SPEC, surrogate_function=surrogate_function, step_mode="m", backend=backend,
                         v_threshold=v_threshold, v_reset=v_reset, **spec_params)
        self.__dict__["_act_dim"], self.__dict__["_dec_pop_dim"] = act_dim, dec_pop_dim
        self.__dict__["_out_pop_dim"] = act_dim * dec_pop_dim
        self.conn = population_connection(act_dim, dec_pop_dim)

    @property
    def num_node(self) -> int:
        return self.out_pop_dim

    def forward(self, x_seq: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        """x_seq [T, *, act_dim * dec_pop_dim] -> spikes of that shape; each step's spikes feed the next step."""
        check_population_input(self, x_seq)
        self.reset()  # every call starts from the initial states (SpikingJelly's init_tensor)
        spikes: list[torch.Tensor] = []
        for t, x in enumerate(x_seq.unbind(0)):
            if t:
                x = x + population_feedback(self.conn, spikes[-1], self.act_dim, self.dec_pop_dim)
            spikes.append(self.single_step_forward(x))
        return torch.stack(spikes)


class ILCIFNode(ILCBaseNode):
    SPEC = "if"

    def __init__(self, act_dim: int, dec_pop_dim: int, v_threshold: float = 1., v_reset: float | None = 0.,
                 surrogate_function: Any = RECT, backend: str | None = None):
        super().__init__(act_dim, dec_pop_dim, v_threshold, v_reset, surrogate_function, backend)


class ILCLIFNode(ILCBaseNode):
    SPEC = "cuba_lif_discrete"  # with c_decay = 0: c = x, h = v_decay * v + x

    def __init__(self, act_dim: int, dec_pop_dim: int, v_decay: float = 0.75, v_threshold: float = 1.,
                 v_reset: float | None = 0., surrogate_function: Any = RECT, backend: str | None = None):
        super().__init__(act_dim, dec_pop_dim, v_threshold, v_reset, surrogate_function, backend,
                         c_decay=0.0, v_decay=v_decay)


class ILCCUBALIFNode(ILCBaseNode):
    SPEC = "cuba_lif_discrete"

    def __init__(self, act_dim: int, dec_pop_dim: int, c_decay: float = 0.5, v_decay: float = 0.75,
                 v_threshold: float = 0.5, v_reset: float | None = 0., surrogate_function: Any = RECT,
                 backend: str | None = None):
        super().__init__(act_dim, dec_pop_dim, v_threshold, v_reset, surrogate_function, backend,
                         c_decay=c_decay, v_decay=v_decay)
