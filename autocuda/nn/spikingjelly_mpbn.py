"""SpikingJelly 2.0's membrane-potential BatchNorm neurons (MPBN, Guo et al. 2023): `MPBNBaseNode` and
`MPBNLIFNode`. After the LIF charge, a BatchNorm (`vbn`, one per feature or channel) normalises the membrane at
every step, over the batch in training (updating its running statistics step by step) and with them in eval; the
spike compares the normalised membrane with the threshold (`exp(a)` per feature with `learnable_vth`).
`re_parameterize_v_threshold()` folds the BatchNorm into a per-feature threshold
((v_threshold - beta) sqrt(sigma2 + eps) / gamma + mu) for inference, optionally re-estimating mu and sigma2 from
the batches in training (test-time adaptation) and normalising the residual membrane below the threshold.

A BatchNorm over the batch at every step is a reduction across neurons, which the spec language (one neuron's
recurrence) does not describe: these are torch compositions on `autocuda.nn.BaseNode`, with SpikingJelly's
constructors, parameters and buffers under its names (`vbn.*`, `a`; after folding `gamma`, `beta`, `mu`,
`sigma2`), step modes, `store_v_seq` and results.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..call import mpbn
from .arguments import BACKENDS, check_backend, require_number
from .neuron import SIGMOID
from .spikingjelly_base import BaseNode

__all__ = ["MPBNBaseNode", "MPBNLIFNode"]


def _folded_option(name: str, what: str) -> property:
    """A switch of the folded layer, kept as `_<name>` (False before folding, as `re_parameterize_v_threshold`'s
    arguments set it): set True before folding, refused by name (it would do nothing)."""
    def get(layer: nn.Module) -> bool:
        return layer.__dict__[f"_{name}"]

    def put(layer: nn.Module, value: bool) -> None:
        if value and not layer.__dict__["_fold_bn"]:
            raise AttributeError(f"{type(layer).__name__}.{name} applies to a folded BatchNorm: call "
                                 f"re_parameterize_v_threshold({name}=True)")
        layer.__dict__[f"_{name}"] = bool(value)
    return property(get, put, doc=f"{what} (`re_parameterize_v_threshold`; False before folding)")


class MPBNBaseNode(BaseNode):
    """`MPBNBaseNode(v_threshold=1., v_reset=0., surrogate_function=Sigmoid(), detach_reset=False, step_mode='s',
    store_v_seq=False, mpbn=True, out_features=None, out_channels=None, learnable_vth=False, bn_momentum=0.1,
    bn_decay_momentum=0.94, bn_min_momentum=0.005)`: exactly one of out_features (BatchNorm1d, inputs [N, C]) and
    out_channels (BatchNorm2d, inputs [N, C, H, W])."""

    mu: torch.Tensor | None
    sigma2: torch.Tensor | None

    def __init__(self, v_threshold: float = 1., v_reset: float | None = 0., surrogate_function: Any = SIGMOID,
                 detach_reset: bool = False, step_mode: str = "s", store_v_seq: bool = False, mpbn: bool = True,
                 out_features: int | None = None, out_channels: int | None = None, learnable_vth: bool = False,
                 bn_momentum: float = 0.1, bn_decay_momentum: float = 0.94, bn_min_momentum: float = 0.005):
        super().__init__(v_threshold, v_reset, surrogate_function, detach_reset, step_mode, store_v_seq)
        if (out_features is None) == (out_channels is None):
            raise ValueError("out_features, out_channels: specify exactly one of them")
        features = out_channels if out_channels is not None else out_features
        if isinstance(features, bool) or not isinstance(features, int) or features < 1:
            raise ValueError(f"{'out_channels' if out_channels is not None else 'out_features'}: expected a whole "
                             f"number >= 1, got {features!r}")
        batch_norm = nn.BatchNorm2d if out_channels is not None else nn.BatchNorm1d
        self.vbn: nn.Module = batch_norm(features) if mpbn else nn.Identity()
        self.register_buffer("mu", None)
        self.register_buffer("sigma2", None)
        self.gamma: torch.Tensor | None = None
        self.beta: torch.Tensor | None = None
        self.eps: float | None = None
        self.__dict__.update(_fold_bn=False, _normalize_residual=False, _running_stats=False)
        for name, value in (("bn_momentum", bn_momentum), ("bn_decay_momentum", bn_decay_momentum),
                            ("bn_min_momentum", bn_min_momentum)):
            require_number(name, value)
        self.bn_momentum, self.bn_decay_momentum, self.bn_min_momentum = bn_momentum, bn_decay_momentum, bn_min_momentum
        if learnable_vth:  # the threshold exp(a) stays positive
            self.a = nn.Parameter(torch.zeros(features))
        self.learnable_vth = learnable_vth

    @property
    def learnable_vth(self) -> bool:
        """Whether the threshold is exp(a), the learnable parameter `a` made at construction. Set False, the layer
        fires at v_threshold; set True, it is refused where `a` was never made (or was folded away)."""
        return self.__dict__["_learnable_vth"]

    @learnable_vth.setter
    def learnable_vth(self, value: bool) -> None:
        value = bool(value)  # as SpikingJelly's `if learnable_vth`
        if value and "a" not in self._parameters:
            raise AttributeError(f"{type(self).__name__}.learnable_vth: the learnable threshold's parameter a is made "
                                 "at construction: build the layer with learnable_vth=True")
        self.__dict__["_learnable_vth"] = value

    @property
    def fold_bn(self) -> bool:
        """Whether the BatchNorm is folded into the threshold (`re_parameterize_v_threshold`, which alone sets it)."""
        return self.__dict__["_fold_bn"]

    @fold_bn.setter
    def fold_bn(self, value: bool) -> None:
        if bool(value) != self.fold_bn:
            raise AttributeError(f"{type(self).__name__}.fold_bn is set by re_parameterize_v_threshold(), which folds "
                                 "the BatchNorm into the threshold (for good: build a new layer to undo it)")

    normalize_residual = _folded_option("normalize_residual", "the folded layer's residual normalisation")
    running_stats = _folded_option("running_stats", "the folded layer's running re-estimation of mu and sigma2 in "
                                                    "training")

    def re_parameterize_v_threshold(self, normalize_residual: bool = False, running_stats: bool = False) -> None:
        """Fold the BatchNorm into the threshold (inference, test-time adaptation): its running mean and variance
        become mu and sigma2, its affine weight and bias gamma and beta, and `vbn` an identity."""
        vbn = self.vbn
        if not isinstance(vbn, nn.modules.batchnorm._BatchNorm):
            return
        self.__dict__["_fold_bn"] = True
        if self.learnable_vth:
            self.v_threshold = torch.exp(self.a.detach())
            del self.a
            self.learnable_vth = False
        self.__dict__.update(_normalize_residual=bool(normalize_residual), _running_stats=bool(running_stats))
        self.mu, self.sigma2 = vbn.running_mean, vbn.running_var
        self.gamma, self.beta, self.eps = vbn.weight, vbn.bias, vbn.eps
        self.vbn = nn.Identity()


class MPBNLIFNode(MPBNBaseNode):
    """`MPBNLIFNode(tau=2., decay_input=False, v_threshold=1., v_reset=0., surrogate_function=Sigmoid(),
    detach_reset=False, step_mode='s', store_v_seq=False, mpbn=True, out_features=None, out_channels=None,
    learnable_vth=False, bn_momentum=0.1, bn_decay_momentum=0.94, bn_min_momentum=0.005)`."""

    def __init__(self, tau: float = 2., decay_input: bool = False, v_threshold: float = 1.,
                 v_reset: float | None = 0., surrogate_function: Any = SIGMOID, detach_reset: bool = False,
                 step_mode: str = "s", store_v_seq: bool = False, mpbn: bool = True, out_features: int | None = None,
                 out_channels: int | None = None, learnable_vth: bool = False, bn_momentum: float = 0.1,
                 bn_decay_momentum: float = 0.94, bn_min_momentum: float = 0.005):
        if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not tau > 1.0:
            raise ValueError(f"tau: must be > 1 (as SpikingJelly requires), got {tau!r}")
        super().__init__(v_threshold, v_reset, surrogate_function, detach_reset, step_mode, store_v_seq, mpbn,
                         out_features, out_channels, learnable_vth, bn_momentum, bn_decay_momentum,
                         bn_min_momentum)
        self.tau, self.decay_input = float(tau), decay_input
        self.backend = None

    @property
    def backend(self) -> str | None:
        """Where multi-step calls run: None, the kernels where the device has them; "torch" the composition;
        "host" the kernels on the CPU (the host runner, for tests). Read at every call."""
        return self.__dict__["_backend"]

    @backend.setter
    def backend(self, value: str | None) -> None:
        check_backend(value)
        self.__dict__["_backend"] = value

    def _statistics(self) -> dict[str, Any]:
        """What a call reads and updates of the normalisation: copies of the BatchNorm's running statistics, and
        the folded mu, sigma2 and momentum (kept by the layer after a call in training)."""
        stats: dict[str, Any] = dict.fromkeys(("running_mean", "running_var", "num_batches_tracked"))
        vbn = self.vbn
        if isinstance(vbn, nn.modules.batchnorm._BatchNorm):
            for name in stats:
                stats[name] = getattr(vbn, name).clone()
        return {**stats, "mu": self.mu, "sigma2": self.sigma2, "bn_momentum": self.bn_momentum}

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        x = args[0] if args else None
        if isinstance(x, torch.Tensor) and (x.dtype == torch.bool or x.is_complex()):
            raise TypeError(f"MPBNLIFNode: x: expected a tensor of real numbers, got {x.dtype}")
        stats = self._statistics()
        out = super().forward(*args, _mpbn_stats=stats, **kwargs)
        if self.training:
            vbn = self.vbn
            if isinstance(vbn, nn.modules.batchnorm._BatchNorm):
                for name in ("running_mean", "running_var", "num_batches_tracked"):
                    getattr(vbn, name).copy_(stats[name])
            elif self.fold_bn and not self.learnable_vth:
                self.mu, self.sigma2, self.bn_momentum = stats["mu"], stats["sigma2"], stats["bn_momentum"]
        return out

    def multi_step_functional_forward(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...],
                                      **kwargs: Any) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
        stats = kwargs.setdefault("_mpbn_stats", self._statistics())
        found = self._kernel_steps(inputs, states, stats)
        if found is not None:
            return found
        return super().multi_step_functional_forward(inputs, states, **kwargs)

    def _kernel_steps(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...], stats: dict[str, Any]
                      ) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]] | None:
        """A multi-step call on the MPBN kernels (`call.mpbn`): a BatchNorm with running statistics and a momentum,
        neither folded nor with a learned threshold; None where they do not run it (the composition does)."""
        vbn = self.vbn
        if (len(inputs) != 1 or len(states) != 1 or not isinstance(vbn, nn.modules.batchnorm._BatchNorm)
                or vbn.momentum is None or stats["running_mean"] is None or self.learnable_vth
                or self.normalize_residual or not isinstance(self.v_threshold, float)):
            return None
        settings = mpbn.Settings(self.tau, bool(self.decay_input), self.v_threshold, self.v_reset,
                                 bool(self.detach_reset), self.training, float(vbn.momentum), float(vbn.eps),
                                 self.surrogate_function)
        found = mpbn.run(inputs[0], states[0], vbn.weight, vbn.bias, stats["running_mean"], stats["running_var"],
                         settings, BACKENDS[self.backend])
        if found is None:
            return None
        if self.training:
            stats["num_batches_tracked"].add_(inputs[0].shape[0])
        return (found[0],), (found[1],)

    def single_step_functional_forward(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...],
                                       **kwargs: Any) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
        stats = kwargs.get("_mpbn_stats") or self._statistics()
        x, v = inputs[0], states[0]
        rest = 0.0 if self.v_reset is None else self.v_reset
        h = v + (x - (v - rest)) / self.tau if self.decay_input else v - (v - rest) / self.tau + x
        h = self._normalised(h, stats)
        if self.fold_bn and not self.learnable_vth and self.training and not (h.dim() == 2 and h.shape[0] == 1):
            self._estimate(h, stats)
        feature_shape = (1, -1) if h.dim() == 2 else (1, -1, 1, 1)
        threshold = self._threshold(stats)
        if self.fold_bn or self.learnable_vth:
            threshold = threshold.view(feature_shape)
        spike = self.surrogate_function(h - threshold)
        if self.normalize_residual:
            h = torch.where(h - threshold <= 0, self._residual(h, stats, feature_shape), h)
        spike_d = spike.detach() if self.detach_reset else spike
        if self.v_reset is None:
            h = self.apply_soft_reset(h, spike_d, self.v_threshold)
        else:
            h = self.apply_hard_reset(h, spike_d, self.v_reset)
        return (spike,), (h, *states[1:])

    def _normalised(self, h: torch.Tensor, stats: dict[str, Any]) -> torch.Tensor:
        """The BatchNorm of the membrane (its statistics in `stats`, updated in training), where there is one."""
        vbn = self.vbn
        if not isinstance(vbn, nn.modules.batchnorm._BatchNorm):
            return h
        factor = 0.0 if vbn.momentum is None else vbn.momentum
        if self.training:
            stats["num_batches_tracked"].add_(1)
            if vbn.momentum is None:  # a cumulative average
                factor = 1.0 / float(stats["num_batches_tracked"])
        return F.batch_norm(h, stats["running_mean"], stats["running_var"], vbn.weight, vbn.bias, self.training,
                            factor, vbn.eps)

    def _estimate(self, h: torch.Tensor, stats: dict[str, Any]) -> None:
        """Folded and training: mu and sigma2 from the batch (blended into the running ones, with a momentum that
        decays to its floor, under `running_stats`)."""
        dims = 0 if h.dim() == 2 else (0, 2, 3)
        batch_mu = h.mean(dim=dims).detach()
        batch_sigma2 = h.var(dim=dims, unbiased=True).detach()
        if self.running_stats:
            momentum = stats["bn_momentum"]
            stats["mu"] = stats["mu"].detach() * (1 - momentum) + batch_mu * momentum
            stats["sigma2"] = stats["sigma2"].detach() * (1 - momentum) + batch_sigma2 * momentum
            stats["bn_momentum"] = max(momentum * self.bn_decay_momentum, self.bn_min_momentum)
        else:
            stats["mu"], stats["sigma2"] = batch_mu, batch_sigma2

    def _threshold(self, stats: dict[str, Any]) -> Any:
        if self.fold_bn and not self.learnable_vth:
            assert self.beta is not None and self.gamma is not None and self.eps is not None  # set by the folding
            return (self.v_threshold - self.beta) * torch.sqrt(stats["sigma2"] + self.eps) / self.gamma + stats["mu"]
        if self.learnable_vth:
            return torch.exp(self.a)
        return self.v_threshold

    def _residual(self, h: torch.Tensor, stats: dict[str, Any], feature_shape: tuple[int, ...]) -> torch.Tensor:
        """The membrane normalised as the folded BatchNorm would (where it stays below the threshold)."""
        assert self.gamma is not None and self.beta is not None and self.eps is not None
        sigma = torch.sqrt(stats["sigma2"] + self.eps).view(feature_shape)
        mu = stats["mu"].view(feature_shape)
        return (h - mu) / sigma * self.gamma.view(feature_shape) + self.beta.view(feature_shape)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", tau={self.tau}, decay_input={self.decay_input}"
