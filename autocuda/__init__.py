"""autocuda: fused, differentiable CUDA kernels for spiking neurons, generated from a few lines of description.

Pipeline (one module per stage): spec (spec.model) -> parse (spec.parse) -> derive (spec.derive) ->
print (codegen.printer) -> render (codegen.neuron, templates/) -> compile (runtime.compile) ->
launch (runtime.launch, runtime.neuron) -> op -> module. Underneath: the builder DSL (CKernel, cfunction).
"""
from __future__ import annotations

from . import cfunction
from .ckernel import CKernel, CKernel1D, CKernel2D, CodeBlock, CodeTyper, KernelArgumentError
from .dtypes import DTYPES, get_dtype
from .errors import SpecError
from .kernels import neuron_kernel, source
from .spec import NeuronSpec, Param, ParsedSpec, State, list_specs, load_spec, parse_expression, spec_from_toml
from .surrogate import SURROGATES, Surrogate, get_surrogate

__version__ = "0.1.0"

__all__ = [
    "CKernel", "CKernel1D", "CKernel2D", "CodeBlock", "CodeTyper", "KernelArgumentError", "cfunction",
    "DTYPES", "get_dtype", "SpecError", "NeuronSpec", "Param", "State", "ParsedSpec", "load_spec", "list_specs",
    "spec_from_toml", "parse_expression", "Surrogate", "SURROGATES", "get_surrogate", "neuron_kernel", "source",
    "__version__",
]
