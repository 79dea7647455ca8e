"""Neuron layers as `torch.nn.Module`s: `Neuron` for any spec, and SpikingJelly-compatible classes.

- `neuron.py`: `Neuron`, the layer of any spec (states, step modes, parameters).
- `spikingjelly.py`: SpikingJelly's class names and constructors (`LIFNode`, ...), each a `Neuron` of a shipped spec.
"""
from __future__ import annotations

from .neuron import Neuron
from .spikingjelly import (
    AdExNode,
    ALIFNode,
    EIFNode,
    IFNode,
    IzhikevichNode,
    LIFNode,
    ParametricLIFNode,
    QIFNode,
)

__all__ = ["Neuron", "IFNode", "LIFNode", "ParametricLIFNode", "QIFNode", "EIFNode", "IzhikevichNode", "AdExNode",
           "ALIFNode"]
