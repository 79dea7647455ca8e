"""autocuda: fused, differentiable CUDA kernels for spiking neurons, generated from a few lines of description.

Pipeline (one module per stage): spec (spec.model) -> parse (spec.parse) -> derive (spec.derive) ->
print (codegen.printer) -> render (codegen.neuron_kernel, codegen/templates/) -> compile (toolchain.compile)
-> launch (toolchain.launch, runtime.neuron_launch) -> op (call.ops) -> module (nn). Underneath: the builder
DSL (CKernel, cfunction). Each folder is one layer, and imports point down the layers only
(tests/test_layers.py holds the list); this package wires the services the spec layer uses but does not own
(`spec.hooks`) when it is imported, before any spec exists, and finds the public module names of modules
in layer folders (`_ALIASES`).
"""
from __future__ import annotations

from typing import Any

from .base import aliases
from .base.lazy import exported
from .base.version import __version__

# Public names and the modules they live in, imported on first use: `import autocuda` stays cheap, and a process
# that runs only cached kernels never imports sympy (see autocuda.base.lazy).
_HOMES = {
    **dict.fromkeys(("CKernel", "CKernel1D", "CKernel2D", "CodeBlock", "CodeTyper", "KernelArgumentError"),
                    ".codegen.ckernel"),
    "DTYPES": ".codegen.dtypes", "get_dtype": ".codegen.dtypes",
    "SpecError": ".base.errors", "AutocudaError": ".base.errors",
    "neuron_kernel": ".codegen.kernels", "source": ".codegen.kernels",
    **dict.fromkeys(("NeuronSpec", "Param", "State", "ParsedSpec", "load_spec", "list_specs", "spec_from_toml",
                     "parse_expression"), ".spec"),
    **dict.fromkeys(("SURROGATES", "Surrogate", "get_surrogate"), ".spec.surrogate"),
    "neuron": ".spec.python",
}
# Every public submodule (each documented one among them: tests/test_imports.py checks both lists)
_SUBMODULES = ("cfunction", "ckernel", "dtypes", "errors", "spec", "surrogate", "functional", "nn", "ops", "testing",
               "reference", "nir", "monitor", "plot", "encoding", "progress")

# Public module names whose modules live in a layer folder: `import autocuda.surrogate` finds the module
# `autocuda.spec.surrogate` itself (autocuda.base.aliases; docs/architecture.md).
_ALIASES = {"cfunction": ".codegen.cfunction", "ckernel": ".codegen.ckernel", "dtypes": ".codegen.dtypes",
            "errors": ".base.errors", "surrogate": ".spec.surrogate", "functional": ".call.functional",
            "ops": ".call.ops", "testing": ".tools.testing", "reference": ".runtime.reference", "nir": ".tools.nir",
            "monitor": ".tools.monitor", "plot": ".tools.plot", "encoding": ".call.encoding",
            "progress": ".base.progress", "native": ".call.native", "cli": ".tools.cli"}
aliases.install({f"{__name__}.{alias}": f"{__name__}{real}" for alias, real in _ALIASES.items()})

__all__ = ["cfunction", *_HOMES, "__version__"]


def _kernel_source(spec: Any, kernel: str, dtype: Any, **options: Any) -> str:
    from .codegen.kernels import source  # the generator (sympy): imported on the first source asked for

    return source(spec, kernel, dtype, **options)


def _wire_spec_hooks() -> None:
    from .spec import hooks
    from .toolchain import cnames, parse_marks

    hooks.set_parse_cache(parse_marks.parsed_before, parse_marks.remember_parsed)
    hooks.set_reserved_names(cnames.argument_key_problem)
    hooks.set_kernel_source(_kernel_source)


_wire_spec_hooks()


def __getattr__(name: str) -> Any:
    return exported(__name__, _HOMES, name, _SUBMODULES)


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES, *_SUBMODULES})
