"""`BatchNormNeuron`: BatchNorm followed by a neuron layer, the normalisation applied inside the neuron's kernels.

BatchNorm's output is an affine map per channel c: `y = a_c * x + b_c` with `a_c = weight_c / sqrt(var_c + eps)`
and `b_c = bias_c - mean_c * a_c`. The layer computes a and b with torch ops (batch statistics in training,
running statistics in eval, exactly as `torch.nn.BatchNorm2d` does, so autograd gives BatchNorm's own gradients,
through the statistics too) and hands them to the neuron as the two tensor parameters of
`spec.transform.with_input_affine(spec)`: the kernels read x and never a normalised copy of it. Backward reads x
anyway (the gradient of the scale is the normalised input's times x), so for float32 and float64 input the
multi-step kernels save no h: backward replays h from x (`functional.multi_step`'s `save_h=False`); for float16 and
bfloat16 input they save h unless the neuron's `save_h` is False.

Shapes: step_mode 'm' takes the convolution's output [T, B, C, *spatial] and computes statistics over T, B and
the spatial dims (SpikingJelly's `SeqToANNContainer(BatchNorm2d)` and multi-step `layer.BatchNorm2d`: T folded
into the batch); 's' takes [B, C, *spatial] and computes them over each step's batch (single-step
`layer.BatchNorm2d`). `dims` = 1, 2, 3 is BatchNorm1d ([B, C] or [B, C, L]), 2d ([B, C, H, W]), 3d. Statistics
are float32 for float16/bfloat16 inputs (as torch's BatchNorm keeps them), float64 for float64.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, cast

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.utils import parametrize

from ..call import functional as F
from ..call.program import Call
from ..runtime.configs import spec_ref
from ..spec.model import NeuronSpec
from ..spec.transform import INPUT_SCALE, INPUT_SHIFT, with_input_affine
from . import batchnorm_passes as passes
from .arguments import BACKENDS, has_hooks, refuse_proxy, refuse_script
from .layer_call import append_v_seq, read_params, start_states, store_states, sync_surrogate
from .memory import StepBase
from .neuron import Neuron

__all__ = ["BatchNormNeuron", "Finding", "batchnorm_fusions", "fuse_batchnorm"]

# the per-step input shapes BatchNorm{1,2,3}d accepts
SHAPES = {1: ("B, C", "B, C, L"), 2: ("B, C, H, W",), 3: ("B, C, D, H, W",)}
_LOW = (torch.float16, torch.bfloat16)
# Inputs whose kernels replay h from x rather than save it (float16 and bfloat16 save it: there the replay's
# arithmetic costs more than the bytes it saves); the two backward passes replay it
_REPLAYS_H = (torch.float32, torch.float64)


class BatchNormNeuron(nn.Module, StepBase):
    """BatchNorm{dims}d (`num_features`, `eps`, `momentum` (None: cumulative average), `affine`,
    `track_running_stats`; the same parameters and buffers) followed by `neuron`: a `Neuron` layer (kept as
    `self.neuron`, with its states, step mode and parameters), or a spec (name or NeuronSpec) with the
    `Neuron`'s keyword arguments in `neuron_args`. The step mode is the neuron's. Where SpikingJelly is installed it
    is one of its `base.StepModule`s, as the neuron is, so that SpikingJelly's code that tells step modules by
    `isinstance` (the fx tracer of its `fuse_conv_bn_eval_modules`, which keeps them whole) takes it as one."""

    __prepare_scriptable__ = refuse_script  # torch.jit.script: refused by name
    weight: nn.Parameter | None
    bias: nn.Parameter | None
    running_mean: torch.Tensor | None
    running_var: torch.Tensor | None
    num_batches_tracked: torch.Tensor | None

    def __init__(self, num_features: int, neuron: Neuron | NeuronSpec | str = "lif", *, eps: float = 1e-5,
                 momentum: float | None = 0.1, affine: bool = True, track_running_stats: bool = True, dims: int = 2,
                 device: Any = None, dtype: Any = None, **neuron_args: Any):
        super().__init__()
        if isinstance(num_features, bool) or not isinstance(num_features, int) or num_features < 1:
            raise ValueError(f"num_features: expected a positive int (the channels), got {num_features!r}")
        if dims not in SHAPES:
            raise ValueError(f"dims: expected 1, 2 or 3 (as BatchNorm1d/2d/3d), got {dims!r}")
        if isinstance(neuron, (str, NeuronSpec)):
            neuron = Neuron(neuron, **neuron_args)
        elif neuron_args:
            raise TypeError(f"neuron_args {sorted(neuron_args)} are for a neuron given as a spec; "
                            f"this neuron is a layer already")
        _check_neuron(neuron)
        self.neuron = neuron
        self.num_features, self.eps, self.momentum, self.dims = num_features, float(eps), momentum, dims
        self.affine, self.track_running_stats = bool(affine), bool(track_running_stats)
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.ones(num_features, **factory)) if affine else None
        self.bias = nn.Parameter(torch.zeros(num_features, **factory)) if affine else None
        if track_running_stats:
            self.register_buffer("running_mean", torch.zeros(num_features, **factory))
            self.register_buffer("running_var", torch.ones(num_features, **factory))
            self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long, device=device))
        else:
            self.running_mean = self.running_var = self.num_batches_tracked = None
        self._fused = (neuron.spec, spec_ref(with_input_affine(neuron.spec)))

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "neuron":  # the layer calls the neuron's kernels itself: a neuron set later is checked as at first
            _check_neuron(value)
        super().__setattr__(name, value)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        # a spec reference names an object registered in the process that made it (unpickling: register here)
        self._fused = (self.neuron.spec, spec_ref(with_input_affine(self.neuron.spec)))

    @classmethod
    def from_batchnorm(cls, bn: _BatchNorm, neuron: Neuron) -> BatchNormNeuron:
        """The layer of `bn` followed by `neuron`, sharing bn's parameters and buffers (an optimizer built on the
        model before keeps working) and its train/eval mode."""
        dims = next((d for d, kind in _KINDS.items() if isinstance(bn, kind)), None)
        if dims is None:
            raise TypeError(f"bn: expected a torch BatchNorm1d/2d/3d, got {type(bn).__name__}")
        fused = cls(bn.num_features, neuron, eps=bn.eps, momentum=bn.momentum, affine=bn.affine, dims=dims)
        for name in ("weight", "bias"):
            setattr(fused, name, getattr(bn, name))
        # bn's buffers, None where bn has none, whatever its `track_running_stats` (set after construction, it
        # no longer says whether the buffers exist)
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            fused.register_buffer(name, getattr(bn, name, None))
        fused.track_running_stats = bn.track_running_stats
        return fused.train(bn.training)

    # -- BatchNorm's interface ------------------------------------------------------------------------
    def reset_running_stats(self) -> None:
        """As torch's BatchNorm: the running statistics at their start, while `track_running_stats` holds."""
        if not self.track_running_stats:
            return
        for buffer, value in ((self.running_mean, 0), (self.running_var, 1), (self.num_batches_tracked, 0)):
            if buffer is not None:
                buffer.fill_(value)

    def reset_parameters(self) -> None:
        self.reset_running_stats()
        for parameter, value in ((self.weight, 1.0), (self.bias, 0.0)):
            if parameter is not None:
                nn.init.constant_(parameter, value)

    # -- the neuron's interface -----------------------------------------------------------------------
    @property
    def step_mode(self) -> str:
        return self.neuron.step_mode

    @step_mode.setter
    def step_mode(self, mode: str) -> None:
        if mode not in ("s", "m"):
            raise ValueError(f"step_mode: expected 's' (single step) or 'm' (multi step), got {mode!r}")
        self.neuron.step_mode = mode

    def reset(self) -> None:
        """Reset the neuron's states (the statistics are BatchNorm's: `reset_running_stats`)."""
        self.neuron.reset()

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}, dims={self.dims}")

    # -- forward --------------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mode = self.neuron.step_mode
        if mode not in ("s", "m"):
            raise ValueError(f"step_mode: expected 's' or 'm', got {mode!r}")
        first = 1 if mode == "m" else 0
        self._check(x, first)
        self._check_settings()
        if x.numel() == 0 and (self.training or self.running_mean is None):
            return self._empty(x, first)
        # hooks on the neuron (a Monitor's, a user's, from before fuse_batchnorm) run as on an unfused neuron: it is
        # called on BatchNorm's output, computed with torch; else the fused kernels run, never calling it
        hooked = has_hooks(self.neuron)
        if mode == "m" and not hooked and self._two_passes_fit(x):
            spikes = self._run_two_passes(x)
            if spikes is not None:
                return spikes
        scale, shift = self._affine(x, first)
        shape = (self.num_features, *(1,) * (x.dim() - first - 2))  # broadcast over the neuron shape [B, C, ...]
        if hooked:
            return self.neuron((x * scale.reshape(shape) + shift.reshape(shape)).to(x.dtype))
        return self._run(x, scale.reshape(shape), shift.reshape(shape), mode)

    def _check(self, x: Any, first: int) -> None:
        if not isinstance(x, torch.Tensor):
            refuse_proxy(self, x)
            raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
        shapes = SHAPES.get(self.dims)  # `dims` is read at each call: a value set later is checked here
        if shapes is None:
            raise ValueError(f"dims: expected 1, 2 or 3 (as BatchNorm1d/2d/3d), got {self.dims!r}")
        if x.dim() - first not in [s.count(",") + 1 for s in shapes]:
            expected = " or ".join(f"[{'T, ' if first else ''}{s}]" for s in shapes)
            raise ValueError(f"x: step_mode {self.step_mode!r} of BatchNorm{self.dims}d expects {expected}, "
                             f"got shape {tuple(x.shape)}")
        if x.shape[first + 1] != self.num_features:
            raise ValueError(f"x: expected {self.num_features} channels at dim {first + 1}, got shape "
                             f"{tuple(x.shape)}")

    def _check_settings(self) -> None:
        """`eps` and the sizes of the parameters and of the running statistics a call reads or updates, as torch's
        BatchNorm checks them at each call (any may have been set after construction): a weight of one value was
        broadcast over the channels, a negative eps made NaN."""
        batch = self.training or self.running_mean is None
        if self.eps < 0 or (batch and self.eps <= 0):
            raise ValueError(f"eps: expected a {'positive' if batch else 'non-negative'} number (as torch's BatchNorm "
                             f"with {'batch' if batch else 'running'} statistics), got {self.eps!r}")
        running = not self.training or self.track_running_stats  # read in eval, updated in training
        for name in ("weight", "bias", *(("running_mean", "running_var") if running else ())):
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != (self.num_features,):
                raise ValueError(f"{name}: expected {self.num_features} values (one per channel), got shape "
                                 f"{tuple(value.shape)}")

    def _empty(self, x: torch.Tensor, first: int) -> torch.Tensor:
        """An empty batch: no statistics to take. torch's BatchNorm passes it through (counting it in training, the
        running statistics unchanged), BatchNorm's parameters getting zero gradients; so here."""
        batches = self.num_batches_tracked
        if self.training and self.track_running_stats and self.running_mean is not None and batches is not None:
            with torch.no_grad():
                batches.add_(1)
        shape = (self.num_features, *(1,) * (x.dim() - first - 2))
        y = x if self.weight is None else x * self.weight.reshape(shape)
        return self.neuron(y if self.bias is None else y + self.bias.reshape(shape))

    def _affine(self, x: torch.Tensor, first: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(a, b) per channel: BatchNorm's output is a * x + b."""
        if self.training or self.running_mean is None:
            count = self._count(x)
            # torch.export keeps no Function's backward (its strict trace ran this one without grad: x's gradient
            # lost the statistics' part silently): there, their torch ops, which autograd differentiates
            statistics = _Statistics.forward if torch.compiler.is_exporting() else _Statistics.apply
            mean, var = statistics(x, first + 1, count)
            self._track(mean.detach(), var.detach(), count)
        else:  # eval, with running statistics
            mean, var = self.running_mean, cast(torch.Tensor, self.running_var)
        scale = torch.rsqrt(var + self.eps)
        if self.weight is not None:
            scale = self.weight * scale
        shift = -mean * scale if self.bias is None else self.bias - mean * scale
        return scale, shift

    def _count(self, x: torch.Tensor) -> int:
        """Values per channel of batch statistics."""
        count = x.numel() // self.num_features
        if count < 2:  # as torch's BatchNorm, whenever it uses batch statistics
            raise ValueError(f"x: expected more than 1 value per channel for batch statistics, got shape "
                             f"{tuple(x.shape)}")
        return count

    def _fused_ref(self) -> str:
        """The reference of the fused spec of the neuron's spec (made afresh when that spec was replaced)."""
        base, ref = self._fused
        if self.neuron.spec is not base:  # the neuron's spec was replaced (other options): fuse that one
            base, ref = self._fused = (self.neuron.spec, spec_ref(with_input_affine(self.neuron.spec)))
        return ref

    def _two_passes_fit(self, x: torch.Tensor) -> bool:
        """Whether a multi-step call may take the two-pass backward (`batchnorm_passes`): training on batch
        statistics, with BatchNorm's affine parameters learned, float32 or float64 contiguous input, the neuron
        keeping no sequence and not recomputing; not under torch.export, which keeps no Function's backward (a
        strict export's spikes had no gradient at all)."""
        n, weight, bias = self.neuron, self.weight, self.bias
        return (self.training or self.running_mean is None) and torch.is_grad_enabled() \
            and not torch.compiler.is_exporting() \
            and x.dtype in _REPLAYS_H and x.is_contiguous() and weight is not None and bias is not None \
            and weight.requires_grad and bias.requires_grad and not n.recompute and not n.store_v_seq

    def _run_two_passes(self, x: torch.Tensor) -> torch.Tensor | None:
        """The call through `batchnorm_passes`, or None where its configuration does not fit (`eligible`)."""
        n = self.neuron
        sync_surrogate(n)  # the neuron's surrogate_function as it is now
        ref = self._fused_ref()
        compiling = torch.compiler.is_compiling()
        weight, bias = cast(torch.Tensor, self.weight), cast(torch.Tensor, self.bias)
        shape = (self.num_features, *(1,) * (x.dim() - 3))
        # a and b stand in as BatchNorm's parameters (their shape, and that they need gradients: the kernels' key)
        params = {**read_params(n, compiling), INPUT_SCALE: weight.reshape(shape), INPUT_SHIFT: bias.reshape(shape)}
        call = Call(ref, x, tuple(x.shape[1:]), start_states(n, x, 1, compiling), n._surrogate_ref, n.detach_reset,
                    None, BACKENDS[n.backend], params, 1, save_h=False)
        if not passes.eligible(call):
            return None
        count = self._count(x)
        spikes, finals, mean, var = passes.two_passes(call, x, weight, bias, self.eps, 2, n.store_final_states)
        self._track(mean, var, count)
        if finals:  # unless the neuron's `store_final_states` is False
            store_states(n, n.state_names, finals, compiling)
        return spikes

    def _track(self, mean: torch.Tensor, var: torch.Tensor, count: int) -> None:
        """BatchNorm's running statistics after a call with batch statistics: momentum, or (None) the cumulative
        average; the unbiased variance. As torch's BatchNorm: in training, while the layer has them and
        `track_running_stats` (read at each call) holds; without a `num_batches_tracked` (set to None) nothing is
        counted, and momentum None then leaves the statistics as they are (torch's factor 0)."""
        running_mean, running_var, batches = self.running_mean, self.running_var, self.num_batches_tracked
        if not (self.training and self.track_running_stats) or running_mean is None or running_var is None:
            return
        if _is_batched(mean):  # torch's BatchNorm refuses it alike
            raise RuntimeError("BatchNormNeuron: under torch.vmap a training call would update the running "
                               "statistics, which are not batched, with batched ones: call it in eval mode or with "
                               "track_running_stats=False")
        with torch.no_grad():
            factor: Any = self.momentum
            if batches is not None:
                batches.add_(1)
                if factor is None:
                    factor = 1.0 / batches.to(running_mean.dtype)
            if factor is None:
                return
            running_mean.mul_(1 - factor).add_(factor * mean.to(running_mean.dtype))
            unbiased = var * (count / (count - 1))
            running_var.mul_(1 - factor).add_(factor * unbiased.to(running_var.dtype))

    def _run(self, x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, mode: str) -> torch.Tensor:
        """The neuron's call (as `Neuron.forward`) on the fused spec, its states kept in the neuron."""
        n = self.neuron
        sync_surrogate(n)  # the neuron's surrogate_function as it is now
        ref = self._fused_ref()
        compiling = torch.compiler.is_compiling()
        params = {**read_params(n, compiling), INPUT_SCALE: scale, INPUT_SHIFT: shift}
        surrogate, detach, backend = n._surrogate_ref, n.detach_reset, BACKENDS[n.backend]
        if mode == "m":
            spikes, finals, seqs = F.multi_step(ref, x, *start_states(n, x, 1, compiling), surrogate=surrogate,
                                                detach_reset=detach, store_state_seq=n.store_v_seq,
                                                final_states=n.store_final_states, backend=backend,
                                                recompute=n.recompute,
                                                save_h=n.save_h and x.dtype not in _REPLAYS_H,
                                                **params)
            if finals is not None:  # unless the neuron's `store_final_states` is False
                store_states(n, n.state_names, finals, compiling)
            if seqs is not None:
                store_states(n, ("v_seq",), seqs[:1], compiling)
            return spikes
        spike, new_states = F.single_step(ref, x, *start_states(n, x, 0, compiling), surrogate=surrogate,
                                          detach_reset=detach, backend=backend, **params)
        store_states(n, n.state_names, new_states, compiling)
        if n.store_v_seq:
            append_v_seq(n, new_states[0], compiling)
        return spike


class _Statistics(torch.autograd.Function):
    """Per channel (dim `channel` of x): mean and biased variance over the other dims, in float32 for
    float16/bfloat16 x. Backward is one expression over x, `x * c1 + c0` with per-channel c1 and c0, since
    d mean/dx = 1/M and d var/dx = 2 (x - mean)/M (M = `count` values per channel); autograd's own derivative of
    var_mean makes several passes over x. Torch ops apart from `setup_context`: torch.func's transforms take it."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, channel: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        return passes.batch_statistics(x.float() if x.dtype in _LOW else x, channel)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[torch.Tensor, int, int], output: tuple[torch.Tensor, torch.Tensor]
                      ) -> None:
        ctx.save_for_backward(inputs[0], output[0])
        ctx.channel, ctx.count = inputs[1], inputs[2]

    @staticmethod
    def backward(ctx: Any, grad_mean: torch.Tensor, grad_var: torch.Tensor) -> tuple[Any, None, None]:
        x, mean = ctx.saved_tensors
        shape = (-1, *(1,) * (x.dim() - ctx.channel - 1))
        c1 = grad_var * (2.0 / ctx.count)
        c0 = grad_mean / ctx.count - c1 * mean
        return torch.addcmul(c0.reshape(shape), x, c1.reshape(shape)).to(x.dtype), None, None


# whether a tensor is vmap's batched view (torch.func)
_is_batched: Any = getattr(getattr(torch._C, "_functorch", None), "is_batchedtensor", lambda tensor: False)
_KINDS = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}
_FORWARDS = ("forward", "single_step_forward", "multi_step_forward")


def _check_neuron(neuron: Any) -> None:
    """A `Neuron` whose forward is Neuron's own (a subclass that changes it would be bypassed here)."""
    if not isinstance(neuron, Neuron):
        raise TypeError(f"neuron: expected an autocuda Neuron layer (LIFNode, Neuron(spec), ...) or a spec, got "
                        f"{type(neuron).__name__}")
    changed = [m for m in _FORWARDS if getattr(type(neuron), m) is not getattr(Neuron, m)]
    if changed:
        raise TypeError(f"neuron: {type(neuron).__name__} overrides {changed[0]}, which the fused layer would "
                        f"bypass")


# ---- rewriting a model ------------------------------------------------------------------------------

class Finding(NamedTuple):
    """A BatchNorm of a model (`path`, as `named_modules` names it) and whether it is (or can be) fused."""

    path: str
    fused: bool
    reason: str


def fuse_batchnorm(model: nn.Module, *, pairs: Sequence[tuple[str, str]] = ()) -> nn.Module:
    """Fuse every BatchNorm that feeds an autocuda neuron layer directly into that neuron, in place; returns
    `model`. The fused layer (`BatchNormNeuron`) takes the neuron's place and shares the BatchNorm's parameters
    and buffers; the BatchNorm's place holds an `nn.Identity`. Found inside `nn.Sequential`s:

    - SpikingJelly's `SeqToANNContainer(..., BatchNorm)` followed by a multi-step neuron (T folded into the
      batch); the BatchNorm leaves the container;
    - a BatchNorm with a step mode (SpikingJelly's `layer.BatchNorm2d`) followed by a neuron of the same mode;
    - a torch BatchNorm followed by a single-step neuron.

    `pairs` names attributes `(bn, neuron)` of modules whose forward passes the first one's output, reshaped
    only, to the second (a multi-step neuron then normalises over T and the batch together). Use
    `batchnorm_fusions(model)` to see what is fused and why the rest is not."""
    _fusions(model, pairs, apply=True)
    return model


def batchnorm_fusions(model: nn.Module, *, pairs: Sequence[tuple[str, str]] = ()) -> list[Finding]:
    """Each BatchNorm of `model` and whether `fuse_batchnorm` fuses it (the reason where not); changes nothing."""
    return _fusions(model, pairs, apply=False)


def _fusions(model: nn.Module, pairs: Sequence[tuple[str, str]], apply: bool) -> list[Finding]:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    for pair in pairs:
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and all(isinstance(n, str) for n in pair)):
            raise TypeError(f"pairs: expected (bn attribute, neuron attribute) name pairs, got {pair!r}")
    found: list[Finding] = []
    seen: set[int] = set()
    for path, module in list(model.named_modules()):
        if type(module) is nn.Sequential:
            found += _sequential(module, path, apply, seen)
        for bn_name, neuron_name in pairs:
            bn, neuron = getattr(module, bn_name, None), getattr(module, neuron_name, None)
            if isinstance(bn, _BatchNorm) and id(bn) not in seen:
                seen.add(id(bn))
                found.append(_pair(module, path, bn_name, neuron_name, bn, neuron, apply))
    left = "not followed by a neuron layer inside an nn.Sequential (a module that calls both: pass pairs=)"
    found += [Finding(p, False, left) for p, m in model.named_modules()
              if isinstance(m, _BatchNorm) and id(m) not in seen]
    return found


def _sequential(seq: nn.Sequential, path: str, apply: bool, seen: set[int]) -> list[Finding]:
    found = []
    children: list[tuple[str, Any]] = list(seq.named_children())
    for (name, first), (next_name, second) in zip(children, children[1:]):
        bn, inside = (first[-1], True) if _is_container(first) else (first, False)
        if not isinstance(bn, _BatchNorm) or id(bn) in seen:
            continue
        seen.add(id(bn))
        where = _join(path, name) + (f".{len(first) - 1}" if inside else "")
        problem = _problem(bn, second, inside)
        if problem is not None:
            found.append(Finding(where, False, problem))
            continue
        if apply:
            setattr(seq, next_name, BatchNormNeuron.from_batchnorm(bn, second))
            if inside and len(first) > 1:
                del first[len(first) - 1]
            else:
                setattr(seq, name, nn.Identity())
        found.append(Finding(where, True, f"fused into the neuron {_join(path, next_name)}"))
    return found


def _pair(module: nn.Module, path: str, bn_name: str, neuron_name: str, bn: _BatchNorm, neuron: Any,
          apply: bool) -> Finding:
    where = _join(path, bn_name)
    problem = _problem(bn, neuron, None)
    if problem is not None:
        return Finding(where, False, problem)
    if apply:
        setattr(module, neuron_name, BatchNormNeuron.from_batchnorm(bn, neuron))
        setattr(module, bn_name, nn.Identity())
    return Finding(where, True, f"fused into the neuron {_join(path, neuron_name)}")


def _problem(bn: _BatchNorm, neuron: Any, inside: bool | None) -> str | None:
    """Why `bn` followed by `neuron` cannot be fused, or None. `inside`: bn is the last layer of a
    SeqToANNContainer (it sees [T * B, ...]); None: a declared pair (its shapes are the caller's word)."""
    if not isinstance(neuron, Neuron):
        return f"followed by {type(neuron).__name__}, not an autocuda neuron layer"
    try:
        _check_neuron(neuron)
    except TypeError as error:
        return str(error)
    if not isinstance(bn, tuple(_KINDS.values())):  # SyncBatchNorm, a lazy one not initialised yet, ...
        return f"{type(bn).__name__} is not a BatchNorm1d/2d/3d"
    # what the fused layer would not do: bn's own forward (a subclass's), its hooks, its parametrizations
    if type(bn).forward is not _BatchNorm.forward and not _is_spikingjelly_batchnorm(bn):
        return f"{type(bn).__name__} overrides forward, which the fused layer would bypass"
    if bn._forward_hooks or bn._forward_pre_hooks or bn._backward_hooks or bn._backward_pre_hooks:
        return f"{type(bn).__name__} has hooks, which would not run on the fused layer"
    if parametrize.is_parametrized(bn):
        return f"{type(bn).__name__} has parametrizations (torch.nn.utils.parametrize), which the fused layer " \
               f"would not apply"
    mode = getattr(bn, "step_mode", None)
    if inside:
        if mode not in (None, "s"):
            return f"a BatchNorm of step mode {mode!r} inside SeqToANNContainer"
        return None if neuron.step_mode == "m" else "SeqToANNContainer followed by a single-step neuron"
    if inside is None or mode == neuron.step_mode or (mode is None and neuron.step_mode == "s"):
        return None
    if mode is None:
        return "a torch BatchNorm before a multi-step neuron sees [T, B, ...], not a batch: left as it is"
    return f"step modes differ: BatchNorm {mode!r}, neuron {neuron.step_mode!r}"


def _is_spikingjelly_batchnorm(bn: _BatchNorm) -> bool:
    """SpikingJelly's `layer.BatchNorm1d/2d/3d` (torch's, with a step mode), known without importing it."""
    kind = type(bn)
    return kind.__name__ in ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d") \
        and kind.__module__.startswith("spikingjelly.") and kind.__bases__[0] is getattr(nn, kind.__name__)


def _is_container(module: Any) -> bool:
    """SpikingJelly's SeqToANNContainer (T folded into the batch around its layers), known without importing it."""
    kind = type(module)
    return kind.__name__ == "SeqToANNContainer" and kind.__module__.startswith("spikingjelly.") and len(module) > 0


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
