"""NIR (Neuromorphic Intermediate Representation) import and export: models from and to other frameworks.

- `from_nir(graph_or_path, dt=...)`: a NIR graph as a torch module (`NIRModule`) whose spiking neurons are our
  layers (`autocuda.nn.Neuron` of the specs in `specs.py`), the rest torch modules (`importer.py`, `modules.py`),
  run in the order of the graph's edges, recurrent ones included (`graph.py`).
- `to_nir(model, sample_input, dt=...)`: a chain of torch layers and our neurons, or an imported graph, as a
  `nir.NIRGraph` (`exporter.py`).
Needs the `nir` package (`pip install nir`); see docs/nir.md.
"""
from __future__ import annotations

from .exporter import NEURON_EXPORTS, to_nir
from .graph import NIRModule
from .importer import NODE_TYPES, from_nir
from .specs import nir_spec

__all__ = ["from_nir", "to_nir", "NIRModule", "nir_spec", "NODE_TYPES", "NEURON_EXPORTS"]
