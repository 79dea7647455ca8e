"""Neuron layers as `torch.nn.Module`s: `Neuron` for any spec, and SpikingJelly-compatible classes.

- `neuron.py`: `Neuron`, the layer of any spec (states, step modes, parameters, SpikingJelly's memory protocol).
- `spikingjelly.py`: SpikingJelly's class names and constructors (`LIFNode`, ...), each a `Neuron` of a shipped spec.
- `flexsn.py`: `FlexSN`, a neuron written as a Python step function (SpikingJelly 2.0's interface).
- `batchnorm.py`: `BatchNormNeuron` (BatchNorm applied inside the neuron's kernels), `fuse_batchnorm`.
- `spikingjelly_more.py`: more of SpikingJelly's classes (`SimpleIFNode`, `CUBALIFNode`, `KLIFNode`, ...).
- `spikingjelly_variants.py`: SpikingJelly's classes whose output is not the spike (`NonSpikingIFNode`,
  `LIAFNode`, ...) or whose reset is an update (`ComplementaryLIFNode`); `output.py`: a spec's output.
- `spikingjelly_levels.py`: SpikingJelly's classes with a multi-level spike (`TernaryIFNode`, `TernaryLIFNode`,
  `ILIFNode`).
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
from .spikingjelly_levels import ILIFNode, TernaryIFNode, TernaryLIFNode
from .spikingjelly_more import CUBALIFNode, HalfThresholdIFNode, KLIFNode, RAFNode, SimpleIFNode, SimpleLIFNode
from .spikingjelly_variants import ComplementaryLIFNode, LIAFNode, NonSpikingIFNode, NonSpikingLIFNode

__all__ = ["Neuron", "IFNode", "LIFNode", "ParametricLIFNode", "QIFNode", "EIFNode", "IzhikevichNode", "AdExNode",
           "ALIFNode", "SimpleIFNode", "SimpleLIFNode", "HalfThresholdIFNode", "CUBALIFNode", "KLIFNode", "RAFNode",
           "NonSpikingIFNode", "NonSpikingLIFNode", "LIAFNode", "ComplementaryLIFNode", "TernaryIFNode",
           "TernaryLIFNode", "ILIFNode",
           "FlexSN", "BatchNormNeuron", "fuse_batchnorm", "batchnorm_fusions"]
