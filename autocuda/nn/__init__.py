"""Neuron layers as `torch.nn.Module`s: `Neuron` for any spec, and SpikingJelly-compatible classes.

- `neuron.py`: `Neuron`, the layer of any spec (states, step modes, parameters, SpikingJelly's memory protocol).
- `spikingjelly.py`: SpikingJelly's class names and constructors (`LIFNode`, ...), each a `Neuron` of a shipped spec.
- `flexsn.py`: `FlexSN`, a neuron written as a Python step function (SpikingJelly 2.0's interface).
- `batchnorm.py`: `BatchNormNeuron` (BatchNorm applied inside the neuron's kernels), `fuse_batchnorm`.
- `spikingjelly_more.py`: more of SpikingJelly's classes (`SimpleIFNode`, `CUBALIFNode`, `KLIFNode`, ...).
- `spikingjelly_variants.py`: SpikingJelly's classes whose output is not the spike (`NonSpikingIFNode`,
  `LIAFNode`, ...) or whose reset is an update (`ComplementaryLIFNode`); `output.py`: a spec's output.
- `spikingjelly_noisy.py`: SpikingJelly's noisy nodes (`NoisyCUBALIFNode`, ...: 1/f^beta noise episodes);
  `spikingjelly_ilc.py`: its nodes with inter-layer connections (`ILCIFNode`, ...);
  `spikingjelly_few_spike.py`: its few-spike nodes (`FewSpikeNode`, `HGNode`, ... and `FewSpikeTable`);
  `spikingjelly_online.py`: its LIF nodes for online training (`OTTTLIFNode`, `SLTTLIFNode`).
- `spikingjelly_levels.py`: SpikingJelly's classes with a multi-level spike (`TernaryIFNode`, `TernaryLIFNode`,
  `ILIFNode`); `spikingjelly_conversion.py`: its ANN-to-SNN conversion neurons (`STBIFNode`,
  `ActivationAwareIFNode`), specs with levels too.
- `spikingjelly_base.py`: SpikingJelly's base classes for subclassing (`BaseNode`, `AdaptBaseNode`,
  `SimpleBaseNode`, `NonSpikingBaseNode`), in torch; `spikingjelly_mpbn.py`: its membrane-potential BatchNorm
  neurons (`MPBNBaseNode`, `MPBNLIFNode`), torch compositions on `BaseNode`.
- `spikingjelly_glif.py`: SpikingJelly's `GatedLIFNode`: its input gate in torch, its recurrence a spec.
- `spikingjelly_dsr.py`: SpikingJelly's DSR neurons (`DSRIFNode`, `DSRLIFNode`), torch compositions (their
  backward is a gradient of the spike rate, not BPTT).

Each public name is imported from its module on first use (PEP 562): `import autocuda.nn` imports none of them,
and a process that uses only `FlexSN` never imports the SpikingJelly-compatible classes (nor SpikingJelly).
"""
from __future__ import annotations

from typing import Any

from ..base.lazy import exported

# Public names and the modules they live in, in the order of `__all__`.
_HOMES = {
    "Neuron": ".neuron",
    **dict.fromkeys(("IFNode", "LIFNode", "ParametricLIFNode", "QIFNode", "EIFNode", "IzhikevichNode", "AdExNode",
                     "ALIFNode"), ".spikingjelly"),
    **dict.fromkeys(("SimpleIFNode", "SimpleLIFNode", "HalfThresholdIFNode", "CUBALIFNode", "KLIFNode", "RAFNode"),
                    ".spikingjelly_more"),
    **dict.fromkeys(("NonSpikingIFNode", "NonSpikingLIFNode", "LIAFNode", "ComplementaryLIFNode"),
                    ".spikingjelly_variants"),
    **dict.fromkeys(("TernaryIFNode", "TernaryLIFNode", "ILIFNode"), ".spikingjelly_levels"),
    **dict.fromkeys(("NoisyBaseNode", "NoisyCUBALIFNode", "NoisyILCBaseNode", "NoisyILCCUBALIFNode",
                     "NoisyNonSpikingBaseNode", "NoisyNonSpikingIFNode"), ".spikingjelly_noisy"),
    **dict.fromkeys(("ILCBaseNode", "ILCIFNode", "ILCLIFNode", "ILCCUBALIFNode"), ".spikingjelly_ilc"),
    **dict.fromkeys(("FewSpikeTable", "FewSpikeNode", "OutlierAwareThresholdNode", "HGNode"),
                    ".spikingjelly_few_spike"),
    **dict.fromkeys(("OTTTLIFNode", "SLTTLIFNode"), ".spikingjelly_online"),
    "FlexSN": ".flexsn",
    **dict.fromkeys(("PSN", "MaskedPSN", "SlidingPSN"), ".psn"),
    **dict.fromkeys(("DSRIFNode", "DSRLIFNode"), ".spikingjelly_dsr"),
    **dict.fromkeys(("STBIFNode", "ActivationAwareIFNode"), ".spikingjelly_conversion"),
    **dict.fromkeys(("MPBNBaseNode", "MPBNLIFNode"), ".spikingjelly_mpbn"),
    "GatedLIFNode": ".spikingjelly_glif",
    **dict.fromkeys(("BaseNode", "SimpleBaseNode", "NonSpikingBaseNode", "AdaptBaseNode"), ".spikingjelly_base"),
    **dict.fromkeys(("BatchNormNeuron", "fuse_batchnorm", "batchnorm_fusions"), ".batchnorm"),
}

__all__ = list(_HOMES)


def __getattr__(name: str) -> Any:
    return exported(__name__, _HOMES, name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
