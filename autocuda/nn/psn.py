"""SpikingJelly 2.0's parallel spiking neurons (Fang et al. 2023, arXiv:2304.12760): a learnable mixing of the
inputs over time, then a threshold. Over a sequence X of [T, N] inputs, H = W X + B and S = Θ(H), with W [T, T]
and B [T, 1] learned:

- `PSN(T)`: W any matrix (multi-step only);
- `MaskedPSN(k, T, lambda_init)`: W masked to the band of the last k steps, the mask eased in by `lambda_`
  (M(λ) = λ M_k + (1 − λ) J); single steps once λ >= 1;
- `SlidingPSN(k, exp_init)`: one k-vector of weights slid over time (a banded Toeplitz W for any T).

Matrix work, not a recurrence. A multi-step call runs the mixing kernels (`call.mixing`: one kernel forward, one
backward, H rebuilt from X) where they run it (on a GPU, T <= 64, a surrogate of ours or SpikingJelly's in its
spiking form, outside torch.compile), else SpikingJelly's composition: one matrix product (torch's `addmm`) and the
surrogate's spike function. A single step (MaskedPSN, SlidingPSN) mixes the queue of recent inputs it keeps, as
SpikingJelly's does. The constructors, parameters (their names, shapes and initialisation), memories and results are
SpikingJelly's; `surrogate_function` is read at every call and takes ours or SpikingJelly's objects.
"""
from __future__ import annotations

import math
import operator
from typing import Any

import torch
from torch import nn

from ..base.switches import check_switches
from ..base.tensor_cache import tensor_cache
from ..call import mixing
from ..spec.surrogate import ATan
from .arguments import TakesSurrogate, fixed_at_construction, refuse_proxy, require_number
from .memory import Memories, MemoryBase, MultiStepOnly

__all__ = ["PSN", "MaskedPSN", "SlidingPSN"]

WEIGHTS_FOLLOW = "the weights' shapes follow it"


def _check_order(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected a whole number >= 1, got {value!r}")
    return value


def _sequence(x_seq: Any, steps: int | None, layer: str) -> torch.Tensor:
    """x_seq, checked as a [T, *] tensor with T the layer's `steps` (any T where None)."""
    if not isinstance(x_seq, torch.Tensor):
        refuse_proxy(layer, x_seq)
        raise TypeError(f"{layer}: x_seq: expected a tensor of shape [T, *], got {type(x_seq).__name__}")
    if x_seq.dim() < 1 or (steps is not None and x_seq.shape[0] != steps):
        raise ValueError(f"{layer}: x_seq: expected shape [T, *] with T = {steps}, got {tuple(x_seq.shape)}")
    if not x_seq.is_floating_point():
        raise TypeError(f"{layer}: x_seq: expected a floating dtype, got {x_seq.dtype}")
    return x_seq


def _fire(surrogate: Any, weight: torch.Tensor, bias: torch.Tensor, x_seq: torch.Tensor) -> torch.Tensor:
    """Θ(weight @ rows + bias) over the rows [T, N] of a checked x_seq (`_sequence`), in x_seq's shape, with
    `surrogate`'s gradient: by the mixing kernels where they run the call (`call.mixing.fire`), else as SpikingJelly
    composes it (`torch.addmm` on the rows, then the surrogate)."""
    spikes = mixing.fire(x_seq, weight, bias, surrogate)
    if spikes is not None:
        return spikes
    rows = x_seq.flatten(1) if x_seq.dim() > 1 else x_seq.unsqueeze(1)
    # weights in x's dtype, as the kernels take them (torch's matmul refuses two dtypes; autocast chooses its own)
    return surrogate(torch.addmm(bias.to(x_seq.dtype), weight.to(x_seq.dtype), rows)).view(x_seq.shape)


class PSN(MultiStepOnly, TakesSurrogate):
    """`PSN(T, surrogate_function=ATan())`: H = W X + B over T steps, then the spikes; multi-step only."""

    T = fixed_at_construction("T", WEIGHTS_FOLLOW)

    def __init__(self, T: int, surrogate_function: Any = None):
        super().__init__()
        self.__dict__["_T"] = _check_order("T", T)
        self.surrogate_function = ATan() if surrogate_function is None else surrogate_function
        self.weight = nn.Parameter(torch.zeros(T, T))
        self.bias = nn.Parameter(torch.full((T, 1), -1.0))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    def forward(self, x_seq: torch.Tensor) -> torch.Tensor:
        return _fire(self.surrogate_function, self.weight, self.bias, _sequence(x_seq, self.T, "PSN"))

    def extra_repr(self) -> str:
        return f"T={self.T}"


class _QueuedPSN(TakesSurrogate, Memories, MemoryBase):
    """The step modes and memories of MaskedPSN and SlidingPSN (SpikingJelly's `MemoryModule`s)."""

    def __init__(self, step_mode: str, memories: dict[str, Any]):
        nn.Module.__init__(self)  # not MemoryModule's (where it is the base): it sets the dict this class lacks
        self.step_mode = step_mode
        self._start_memories(memories)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.multi_step_forward(x) if self._step_mode == "m" else self.single_step_forward(x)

    def single_step_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(self.single_step_functional_forward, x)

    def multi_step_forward(self, x_seq: torch.Tensor) -> torch.Tensor:
        return self._run(self.multi_step_functional_forward, x_seq)

    def _run(self, functional: Any, x: torch.Tensor) -> torch.Tensor:
        refuse_proxy(self, x)  # a symbolic trace would keep its first call's queue, and leave Proxies in it
        names = self._memory_names
        (spike,), states = functional((x,), tuple(getattr(self, n) for n in names))
        for name, value in zip(names, states):
            self.__dict__[name] = value
        return spike

    def single_step_functional_forward(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...],
                                       **kwargs: Any) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
        raise NotImplementedError

    def multi_step_functional_forward(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...],
                                      **kwargs: Any) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
        raise NotImplementedError


@tensor_cache(maxsize=64)
def _band(steps: int, k: int, device: torch.device) -> torch.Tensor:
    """Where each entry of SlidingPSN's [T, T] matrix stands in its weights after a leading zero: row i, column j
    holds weight k - 1 - (i - j) (index k - (i - j)) where 0 <= i - j < k, else the zero (index 0)."""
    lag = torch.arange(steps).unsqueeze(1) - torch.arange(steps).unsqueeze(0)
    return torch.where((lag >= 0) & (lag < k), k - lag, 0).to(device)


def _eased_mask(lambda_: torch.Tensor, mask0: torch.Tensor, mask1: torch.Tensor) -> torch.Tensor:
    eased = lambda_.clamp(max=1.0)
    return eased * mask0 + (1.0 - eased) * mask1


@tensor_cache(maxsize=64)
def _placement(steps: int, k: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """[k, T²]: 1 where an entry of SlidingPSN's [T, T] matrix (flat) holds weight i (`_band`), else 0."""
    band = _band(steps, k, device).reshape(1, -1)
    return (band == torch.arange(1, k + 1, device=device).unsqueeze(1)).to(dtype)


class _Banded(torch.autograd.Function):
    """SlidingPSN's [T, T] matrix of its k weights: the gather of `_band` forward; backward sums each weight's
    entries as one product with the band's 0/1 placement (`_placement`), where the gather's own backward
    accumulates through a sort and several more operations. Torch ops apart from `setup_context`: torch.func's
    transforms take it."""

    generate_vmap_rule = True

    @staticmethod
    def forward(weight: torch.Tensor, steps: int) -> torch.Tensor:
        return torch.cat((weight.new_zeros(1), weight))[_band(steps, weight.shape[0], weight.device)]

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[torch.Tensor, int], output: torch.Tensor) -> None:
        ctx.shape = (inputs[1], inputs[0].shape[0])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        steps, k = ctx.shape
        return _placement(steps, k, grad.device, grad.dtype) @ grad.reshape(-1), None


def _pushed(queue: Any, x: torch.Tensor, keep: int) -> tuple[torch.Tensor, ...]:
    """The queue of recent inputs (flattened, oldest first) with x appended, the oldest dropped beyond `keep`."""
    pushed = (*queue, x.flatten())
    return pushed[1:] if len(pushed) > keep else pushed


class MaskedPSN(_QueuedPSN):
    """`MaskedPSN(k, T, lambda_init=0.0, surrogate_function=ATan(), step_mode='s')`: W masked to the last k
    steps, the mask eased in by `lambda_` (set it during training: `layer.lambda_ = ...`). Single steps need
    `lambda_ >= 1` and at most T of them between resets; a multi-step call takes exactly T steps."""

    k, T = fixed_at_construction("k", WEIGHTS_FOLLOW), fixed_at_construction("T", WEIGHTS_FOLLOW)
    _lambda_: torch.Tensor
    mask0: torch.Tensor
    mask1: torch.Tensor
    time_step: int
    queue: list[torch.Tensor]

    def __init__(self, k: int, T: int, lambda_init: float = 0.0, surrogate_function: Any = None,
                 step_mode: str = "s"):
        super().__init__(step_mode, {"time_step": 0, "queue": []})
        self.__dict__["_k"], self.__dict__["_T"] = _check_order("k", k), _check_order("T", T)
        self.surrogate_function = ATan() if surrogate_function is None else surrogate_function
        require_number("lambda_init", lambda_init, finite=True)  # NaN: every output NaN
        self.register_buffer("_lambda_", torch.as_tensor(float(lambda_init)))
        self.weight = nn.Parameter(torch.zeros(T, T))
        self.bias = nn.Parameter(torch.full((T, 1), -1.0))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        ones = torch.ones(T, T)
        self.register_buffer("mask0", torch.tril(ones) * torch.triu(ones, -(k - 1)))
        self.register_buffer("mask1", ones)

    @property
    def lambda_(self) -> torch.Tensor:
        return self._lambda_

    @lambda_.setter
    def lambda_(self, value: float) -> None:
        if not (isinstance(value, torch.Tensor) and value.numel() == 1):
            require_number("lambda_", value)
        if math.isnan(float(value)):  # as at construction: NaN passes every comparison's refusal, then all outputs NaN
            raise ValueError(f"lambda_: expected a number that is not NaN, got {value!r}")
        torch.fill_(self._lambda_, value)

    def masked_weight(self) -> torch.Tensor:
        """SpikingJelly's W * mask0 once lambda_ >= 1, else W * (lambda_ mask0 + (1 - lambda_) mask1), as one
        expression of lambda_ capped at 1 (the same values, no branch on a device value: no wait for the device).
        The eased mask is made again only where lambda_ or a mask is another tensor or was changed in place since
        (their version counters): a call then multiplies W alone."""
        buffers = (self._lambda_, self.mask0, self.mask1)
        if torch.compiler.is_compiling() or any(t.requires_grad or t.is_inference() for t in buffers):
            return _eased_mask(*buffers) * self.weight
        versions = tuple(t._version for t in buffers)
        kept = self.__dict__.get("_eased")
        if kept is None or not all(map(operator.is_, kept[0], buffers)) or kept[1] != versions:
            with torch.inference_mode(False):  # made in inference mode, a later training call could not save it
                kept = self.__dict__["_eased"] = (buffers, versions, _eased_mask(*buffers))
        return kept[2] * self.weight

    def __getstate__(self) -> dict[str, Any]:
        """The layer's state without the eased mask kept between calls: it is keyed by its buffers' version counters,
        which a copy's buffers restart (they could match again while lambda_ differs); a copy makes it again."""
        return {name: value for name, value in super().__getstate__().items() if name != "_eased"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # as `__getstate__`, for a deep copy (`MemoryViews.__deepcopy__` copies the dict) and a layer pickled before
        super().__setstate__({name: value for name, value in state.items() if name != "_eased"})

    def single_step_forward(self, x: torch.Tensor) -> torch.Tensor:
        # SpikingJelly's: a step beyond T still enters the queue before the call is refused
        if self._lambda_ >= 1.0 and self.time_step + 1 > self.T:
            self.queue = list(_pushed(self.queue, x, self.k))
        return super().single_step_forward(x)

    def single_step_functional_forward(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...],
                                       **kwargs: Any) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
        x, (time_step, queue) = inputs[0], states
        if self._lambda_ < 1.0:
            raise ValueError("MaskedPSN: single steps need lambda_ >= 1 (the mask fully eased in), got "
                             f"{float(self._lambda_)}")
        if time_step + 1 > self.T:
            raise OverflowError(f"MaskedPSN(T={self.T}) has run {time_step + 1} time-steps: reset it first")
        pushed = _pushed(queue, x, self.k)
        weight = self.masked_weight()[time_step, time_step + 1 - len(pushed): time_step + 1]
        h = torch.sum(weight.unsqueeze(-1) * torch.stack(pushed), 0)
        spike = self.surrogate_function(h + self.bias[time_step])
        return (spike.view(x.shape),), (time_step + 1, list(pushed))

    def multi_step_functional_forward(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...],
                                      **kwargs: Any) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
        x_seq = _sequence(inputs[0], self.T, "MaskedPSN")
        return (_fire(self.surrogate_function, self.masked_weight(), self.bias, x_seq),), tuple(states)

    def extra_repr(self) -> str:
        return f"k={self.k}, T={self.T}, lambda_={float(self._lambda_)}, step_mode={self._step_mode!r}"


class SlidingPSN(_QueuedPSN):
    """`SlidingPSN(k, exp_init=True, surrogate_function=ATan(), step_mode='s')`: H[t] = Σ_i W_i X[t − k + 1 + i]
    + B with one k-vector W (…, 1/4, 1/2, 1 where `exp_init`, else Kaiming-uniform) and one B, for any T."""

    k = fixed_at_construction("k", WEIGHTS_FOLLOW)
    queue: list[torch.Tensor]

    def __init__(self, k: int, exp_init: bool = True, surrogate_function: Any = None, step_mode: str = "s"):
        super().__init__(step_mode, {"queue": []})
        self.__dict__["_k"] = _check_order("k", k)
        check_switches(exp_init=exp_init)
        self.surrogate_function = ATan() if surrogate_function is None else surrogate_function
        if exp_init:
            weight = torch.ones(k)
            for i in range(k - 2, -1, -1):
                weight[i] = weight[i + 1] / 2.0
        else:
            weight = torch.ones(1, k)
            nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
            weight = weight[0]
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(torch.as_tensor(-1.0))

    def gen_gemm_weight(self, T: int) -> torch.Tensor:
        """The [T, T] matrix of a T-step call: row t holds the last min(t + 1, k) weights, ending at column t (one
        gather from the weights after a zero, which fills the rest; `_Banded`)."""
        # torch.jit.trace's sizes are traced ints, which its record of a Function's call cannot hold
        return _Banded.apply(self._weights(), int(T) if torch.jit.is_tracing() else T)

    def _weights(self) -> torch.Tensor:
        """`weight`, refused by name where one of another shape replaced it: k, which the queue of single steps and
        the band of a sequence follow, is fixed at construction (a multi-step call took the new length, a single
        step failed inside torch's broadcasting)."""
        weight = self.weight
        if weight.shape != (self.k,):
            raise ValueError(f"SlidingPSN: weight: expected shape ({self.k},) (k = {self.k}, fixed at construction), "
                             f"got {tuple(weight.shape)}")
        return weight

    def single_step_functional_forward(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...],
                                       **kwargs: Any) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
        x, (queue,) = inputs[0], states
        pushed = _pushed(queue, x, self.k)
        weight = self._weights()[self.k - len(pushed):].unsqueeze(-1)
        h = torch.sum(weight * torch.stack(pushed), 0)
        return (self.surrogate_function(h + self.bias).view(x.shape),), (list(pushed),)

    def multi_step_functional_forward(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...],
                                      **kwargs: Any) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
        x_seq = _sequence(inputs[0], None, "SlidingPSN")
        return (_fire(self.surrogate_function, self.gen_gemm_weight(x_seq.shape[0]), self.bias, x_seq),), \
            tuple(states)

    def extra_repr(self) -> str:
        return f"order={self.k}, step_mode={self._step_mode!r}"
