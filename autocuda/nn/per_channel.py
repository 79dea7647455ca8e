"""Parameters of one value per channel, as SpikingJelly's classes keep them: 1-D tensors (buffers or parameters)
of C values, broadcast along one dimension of a step's input (`channel_dim`). A call views each as [C, 1, ...]
over the step's trailing dimensions, so that it broadcasts against the neuron shape as the kernels read a
per-channel parameter; the layer keeps (and saves) the 1-D tensors."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["PerChannel"]


class PerChannel:
    """A mixin of an `nn.Module` whose parameters or buffers named in `_per_channel` hold one value or one per
    channel along `channel_dim` of a step's input; a 1-D one is refused at the call unless its length is the
    input's channel count."""

    _per_channel: tuple[str, ...] = ()
    channel_dim: int

    @contextlib.contextmanager
    def _channels_of(self, x: torch.Tensor) -> Iterator[None]:
        """For a call on a step's input `x`: each per-channel tensor viewed along channel_dim of x (a buffer in
        x's dtype too; an integer one, which the kernels do not take, also where it holds one value); the layer's
        own tensors again after the call."""
        buffers = self._buffers  # type: ignore[attr-defined]
        homes = [self._parameters, buffers]  # type: ignore[attr-defined]
        kept = [(home, name, home[name]) for name in self._per_channel for home in homes if home.get(name) is not None]
        try:
            for home, name, value in kept:
                if value.dim() == 1 or not value.is_floating_point():
                    home[name] = self._along_channels(name, value, x, convert=home is buffers)
            yield
        finally:
            for home, name, value in kept:
                home[name] = value

    def _along_channels(self, name: str, value: torch.Tensor, x: torch.Tensor, convert: bool) -> torch.Tensor:
        if convert:
            value = value.to(dtype=x.dtype)
        if value.dim() == 0:
            return value
        channel_dim = self.channel_dim + x.dim() if self.channel_dim < 0 else self.channel_dim
        if not 0 <= channel_dim < x.dim():
            raise ValueError(f"channel_dim={self.channel_dim} is out of range for input with {x.dim()} dimensions.")
        if value.numel() != x.shape[channel_dim]:
            raise ValueError(f"{name} has length {value.numel()}, but input shape {tuple(x.shape)} has "
                             f"{x.shape[channel_dim]} channels at channel_dim={self.channel_dim}.")
        return value.view(value.numel(), *([1] * (x.dim() - 1 - channel_dim)))
