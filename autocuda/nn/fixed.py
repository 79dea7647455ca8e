"""Layer attributes fixed at construction (sizes that parameters' shapes follow, settings that other values were
derived from): read as attributes, refused by name when set, so that a change never goes silently unseen."""
from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["fixed_at_construction"]


def fixed_at_construction(name: str, follows: str) -> property:
    """The attribute `name`, kept in the instance dict as `_<name>` (set there by the constructor); `follows` says
    what was made from it, for the error a later assignment raises."""
    def get(layer: nn.Module) -> Any:
        return layer.__dict__[f"_{name}"]

    def refuse(layer: nn.Module, value: Any) -> None:
        raise AttributeError(f"{type(layer).__name__}.{name} is fixed at construction ({get(layer)!r}): {follows}; "
                             f"build a new layer for {name}={value!r}")
    return property(get, refuse)
