"""Our layers as instances of SpikingJelly's `base.MemoryModule` wherever SpikingJelly is imported, without
importing it (it is no dependency, and `import autocuda` stays quick).

Why: SpikingJelly's free functions (`base.to_functional_forward`, `extract_memories`, `named_memories`,
`functional.set_step_mode`, ...) pick their modules by `isinstance(m, MemoryModule)`. MemoryModule is a plain
class (no ABC, so no `register`), and `isinstance` consults the class's bases: so `Neuron`'s base becomes
MemoryModule (an assignment to `__bases__`; MemoryModule adds no slots, so the instance layout is nn.Module's) as
soon as `spikingjelly.activation_based.base` is imported: at once if it already is, else through an import hook
that runs once, after that module has loaded. `Neuron` defines every method MemoryModule has (or takes
nn.Module's), so a layer behaves the same with either base.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

__all__ = ["join_memory_module"]

SJ_BASE = "spikingjelly.activation_based.base"


def join_memory_module(cls: type) -> None:
    """Make `cls` a subclass of SpikingJelly's MemoryModule once SpikingJelly's `base` is imported."""
    module = sys.modules.get(SJ_BASE)
    if module is not None:
        _rebase(cls, module)
    else:
        sys.meta_path.insert(0, _AfterImport(SJ_BASE, lambda loaded: _rebase(cls, loaded)))


def _rebase(cls: type, module: ModuleType) -> None:
    memory_module = getattr(module, "MemoryModule", None)
    if not isinstance(memory_module, type) or issubclass(cls, memory_module):
        return
    try:
        cls.__bases__ = (memory_module,)
    except TypeError as error:  # a SpikingJelly whose MemoryModule changed its layout: say so, import on
        warnings.warn(f"{cls.__name__} cannot join SpikingJelly's MemoryModule ({error}); SpikingJelly's free "
                      "functions that test isinstance(m, MemoryModule) will skip it", stacklevel=2)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds module `name` as the path finder does, and runs `then(module)` after the module has executed."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
                  ) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # once
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        execute, then = loader.exec_module, self.then

        def exec_module(module: ModuleType) -> None:
            execute(module)
            then(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
