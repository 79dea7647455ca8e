"""Neuron layers as `torch.nn.Module`s: `Neuron` for any spec, and SpikingJelly-compatible classes.

- `neuron.py`: `Neuron`, the layer of any spec (states, step modes, parameters, SpikingJelly's memory protocol).
- `spikingjelly.py`: SpikingJelly's class names and constructors (`LIFNode`, ...), each a `Neuron` of a shipped spec.
- `flexsn.py`: `FlexSN`, a neuron written as a Python step function (SpikingJelly 2.0's interface).
- `batchnorm.py`: `BatchNormNeuron` (BatchNorm applied inside the neuron's kernels), `fuse_batchnorm`.
- `spikingjelly_more.py`: more of SpikingJelly's classes (`SimpleIFNode`, `CUBALIFNode`, `KLIFNode`, ...).
"""
from __future__ import annotations

from .batchnorm import BatchNormNeuron, batchnorm_fusions, fuse_batchnorm
from .flexsn import FlexSN
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
from .spikingjelly_more import CUBALIFNode, HalfThresholdIFNode, KLIFNode, RAFNode, SimpleIFNode, SimpleLIFNode

__all__ = ["Neuron", "IFNode", "LIFNode", "ParametricLIFNode", "QIFNode", "EIFNode", "IzhikevichNode", "AdExNode",
           "ALIFNode", "SimpleIFNode", "SimpleLIFNode", "HalfThresholdIFNode", "CUBALIFNode", "KLIFNode", "RAFNode",
           "FlexSN", "BatchNormNeuron", "fuse_batchnorm", "batchnorm_fusions"]
