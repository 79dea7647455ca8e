"""What the layers share of SpikingJelly's state protocol (`base.MemoryModule`), without depending on SpikingJelly:
their base class, SpikingJelly's `MemoryModule` where it is installed (its free functions, `extract_memories`,
`to_functional_forward`, ..., pick modules by `isinstance`), and the in-place detach of memories
(`functional.detach_net`). Importing SpikingJelly's `base` module alone costs about a millisecond and imports
nothing else of SpikingJelly's.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

__all__ = ["MemoryBase", "MemoryViews", "detach_memories", "memory_module_base"]


def memory_module_base() -> type[nn.Module]:
    """SpikingJelly's `base.MemoryModule` where SpikingJelly is installed, else `nn.Module`."""
    try:
        from spikingjelly.activation_based.base import MemoryModule
    except ImportError:
        return nn.Module
    return MemoryModule if isinstance(MemoryModule, type) and issubclass(MemoryModule, nn.Module) else nn.Module


if TYPE_CHECKING:
    MemoryBase = nn.Module
else:
    MemoryBase = memory_module_base()


class MemoryViews:
    """The views of a layer's memories that SpikingJelly's protocol reads, from the layer's `named_memories()`
    (a base before `MemoryBase`, whose own versions read SpikingJelly's registry)."""

    def named_memories(self) -> Iterator[tuple[str, Any]]:
        raise NotImplementedError

    @property
    def _memories(self) -> dict[str, Any]:
        """The memories by name: what SpikingJelly's `to_functional_forward` counts (a copy; set them by name)."""
        return dict(self.named_memories())

    def memories(self) -> Iterator[Any]:
        for _, value in self.named_memories():
            yield value


def detach_memories(d: dict[str, Any], names: Iterable[str]) -> None:
    """Cut the graphs of the memories `names` held in the dict `d`, in place as SpikingJelly's `detach_()`: a
    tensor held from before loses its graph too. The kernels give states that are tensors of their own (never
    views), except for an input in another memory order (channels_last: its states are permuted views) and under
    torch.compile; a view cannot be detached in place, so it is replaced by a detached tensor (where SpikingJelly
    raises)."""
    for name in names:
        value = d.get(name)
        if isinstance(value, torch.Tensor):
            try:
                value.detach_()
            except RuntimeError:
                d[name] = value.detach()
