"""autocuda: fused, differentiable CUDA kernels for spiking neurons, generated from a few lines of description.

Pipeline (one module per stage): spec (spec.model) -> parse (spec.parse) -> derive (spec.derive) ->
print (codegen.printer) -> render (codegen.neuron_kernel, templates/) -> compile (runtime.compile) ->
launch (runtime.launch, runtime.neuron_launch) -> op -> module. Underneath: the builder DSL (CKernel, cfunction).
Imports point down the layers only (tests/test_layers.py holds the table); this package wires the services the
spec layer uses but does not own (`spec.hooks`) when it is imported, before any spec exists.
"""
from __future__ import annotations

from typing import Any

from .lazy import exported

__version__ = "0.1.0"

# Public names and the modules they live in, imported on first use: `import autocuda` stays cheap, and a process
# that runs only cached kernels never imports sympy (see autocuda.lazy).
_HOMES = {
    **dict.fromkeys(("CKernel", "CKernel1D", "CKernel2D", "CodeBlock", "CodeTyper", "KernelArgumentError"),
                    ".ckernel"),
    "DTYPES": ".dtypes", "get_dtype": ".dtypes", "SpecError": ".errors", "AutocudaError": ".errors",
    "neuron_kernel": ".kernels", "source": ".kernels",
    **dict.fromkeys(("NeuronSpec", "Param", "State", "ParsedSpec", "load_spec", "list_specs", "spec_from_toml",
                     "parse_expression"), ".spec"),
    **dict.fromkeys(("SURROGATES", "Surrogate", "get_surrogate"), ".surrogate"),
    "neuron": ".spec.python",
}
# Every public submodule (each documented one among them: tests/test_imports.py checks both lists)
_SUBMODULES = ("cfunction", "ckernel", "dtypes", "errors", "spec", "surrogate", "functional", "nn", "ops", "testing",
               "reference", "nir", "monitor", "plot", "encoding", "progress")

__all__ = ["cfunction", *_HOMES, "__version__"]


def _kernel_source(spec: Any, kernel: str, dtype: Any, **options: Any) -> str:
    from .kernels import source  # the generator (sympy): imported on the first source asked for

    return source(spec, kernel, dtype, **options)


def _wire_spec_hooks() -> None:
    from . import cnames, parse_marks
    from .spec import hooks

    hooks.set_parse_cache(parse_marks.parsed_before, parse_marks.remember_parsed)
    hooks.set_reserved_names(cnames.argument_key_problem)
    hooks.set_kernel_source(_kernel_source)


_wire_spec_hooks()


def __getattr__(name: str) -> Any:
    return exported(__name__, _HOMES, name, _SUBMODULES)


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES, *_SUBMODULES})
