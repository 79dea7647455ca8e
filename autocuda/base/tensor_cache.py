"""A memo for functions that make a tensor from hashable arguments (an index table, constants on a device): made
once, returned after. It keeps only plain tensors: one made under a tracer's fake mode (torch.export runs the
module's code on fake tensors) holds no data, and kept it would stand in for the table in every later call. Under
torch.compile the function runs as written (Dynamo traces it; nothing is kept from the trace)."""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


def tensor_cache(maxsize: int) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Memoize a tensor-making function of hashable positional arguments, at most `maxsize` results."""
    def wrap(function: Callable[..., Any]) -> Callable[..., Any]:
        kept: dict[tuple, Any] = {}

        @functools.wraps(function)
        def cached(*args: Any) -> Any:
            found = kept.get(args)
            if found is not None:
                return found
            import torch  # callers hold tensors: torch is loaded

            made = function(*args)
            if type(made) is torch.Tensor and not torch.compiler.is_compiling():
                if len(kept) >= maxsize:
                    kept.clear()
                kept[args] = made
            return made

        cached.cache_clear = kept.clear  # type: ignore[attr-defined]
        return cached
    return wrap
