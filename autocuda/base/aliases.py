"""Public module names of the package whose modules live in a layer folder: `autocuda.surrogate` is
`autocuda.spec.surrogate`.

The package's folders are its layers (tests/test_layers.py), and its users import the names it has always had.
`install(aliases)` puts a finder first on `sys.meta_path` that answers the import of an alias, or of a module
under one (`autocuda.nir.importer`), with the module of the real name: one module object under both names
(`autocuda.surrogate is autocuda.spec.surrogate`), whose classes keep their real `__module__`, so a pickle that
names either finds the same class. A package's `__main__` under an alias is a file of its own, as
`python -m autocuda.native` runs it.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Mapping, Sequence
from types import ModuleType


class AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports of `alias[.rest]` answered with the module `real[.rest]` (`aliases`: alias -> real, absolute)."""

    def __init__(self, aliases: Mapping[str, str]) -> None:
        self.aliases = dict(aliases)

    def real_name(self, name: str) -> str | None:
        """The real name of module `name`, or None where no alias covers it."""
        for alias, real in self.aliases.items():
            if name == alias or name.startswith(f"{alias}."):
                return real + name[len(alias):]
        return None

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        real = self.real_name(fullname)
        if real is None:
            return None
        found = importlib.util.find_spec(real)
        if found is None:
            return None
        if real.rpartition(".")[2] == "__main__" and found.origin:  # run by `python -m`: read as a file
            return importlib.util.spec_from_file_location(fullname, found.origin)
        return importlib.machinery.ModuleSpec(fullname, self, is_package=found.submodule_search_locations is not None)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.real_name(spec.name) or spec.name)
        spec.loader_state = module.__spec__  # the import system sets the alias's spec on the module: restored below
        return module

    def exec_module(self, module: ModuleType) -> None:
        spec = module.__spec__
        if spec is not None and isinstance(spec.loader_state, importlib.machinery.ModuleSpec):
            module.__spec__ = spec.loader_state


def install(aliases: Mapping[str, str]) -> AliasFinder:
    """The package's finder of `aliases` (alias -> real module, absolute names), first on `sys.meta_path`; one
    finder a table, also where the package is imported again."""
    for finder in sys.meta_path:
        if isinstance(finder, AliasFinder) and finder.aliases == dict(aliases):
            return finder
    finder = AliasFinder(aliases)
    sys.meta_path.insert(0, finder)
    return finder
