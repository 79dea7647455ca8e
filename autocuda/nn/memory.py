"""What the layers share of SpikingJelly's state protocol (`base.MemoryModule`), without depending on SpikingJelly:
their base class, SpikingJelly's `MemoryModule` where it is installed (its free functions, `extract_memories`,
`to_functional_forward`, ..., pick modules by `isinstance`), and the in-place detach of memories
(`functional.detach_net`). Importing SpikingJelly's `base` module alone costs about a millisecond and imports
nothing else of SpikingJelly's.
"""
from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from .arguments import refuse_script

__all__ = ["MemoryBase", "MemoryViews", "Memories", "MultiStepBase", "MultiStepOnly", "StepBase", "detach_memories",
           "memory_module_base", "step_module_base"]


def memory_module_base() -> type[nn.Module]:
    """SpikingJelly's `base.MemoryModule` where SpikingJelly is installed, else `nn.Module`."""
    try:
        from spikingjelly.activation_based.base import MemoryModule
    except ImportError:
        return nn.Module
    return MemoryModule if isinstance(MemoryModule, type) and issubclass(MemoryModule, nn.Module) else nn.Module


def step_module_base(name: str = "StepModule") -> type:
    """SpikingJelly's `base.StepModule` (or `base.MultiStepModule`, ... by `name`) where SpikingJelly is installed,
    else `object`. SpikingJelly's code tells step modules by `isinstance`: its fx tracer of
    `fuse_conv_bn_eval_modules` and `pack_conv_bn_train_modules` keeps them whole (a leaf), `set_step_mode` warns
    for others."""
    try:
        from spikingjelly.activation_based import base
    except ImportError:
        return object
    found = getattr(base, name, None)
    return found if isinstance(found, type) and not issubclass(found, nn.Module) else object


if TYPE_CHECKING:
    MemoryBase = nn.Module
    StepBase: type = object
    MultiStepBase: type = object
else:
    MemoryBase = memory_module_base()
    StepBase = step_module_base()
    MultiStepBase = step_module_base("MultiStepModule")


class MultiStepOnly(MultiStepBase):
    """SpikingJelly's MultiStepModule (a subclass of it where SpikingJelly is installed): `step_mode` is 'm' and
    cannot be set to anything else; `supported_step_mode()` is ('m',)."""

    def supported_step_mode(self) -> tuple[str, ...]:
        return ("m",)

    @property
    def step_mode(self) -> str:
        return "m"

    @step_mode.setter
    def step_mode(self, value: str) -> None:
        if value != "m":
            raise ValueError(f"step_mode: {type(self).__name__} runs in multi-step mode only ('m'), got {value!r}")


class MemoryViews:
    """The views of a layer's memories that SpikingJelly's protocol reads, from the layer's `named_memories()`
    (a base before `MemoryBase`, whose own versions read SpikingJelly's registry)."""

    __prepare_scriptable__ = refuse_script  # torch.jit.script: refused by name

    def named_memories(self) -> Iterator[tuple[str, Any]]:
        raise NotImplementedError

    @property
    def _memories(self) -> dict[str, Any]:
        """The memories by name: what SpikingJelly's `to_functional_forward` counts (a copy; set them by name)."""
        return dict(self.named_memories())

    def memories(self) -> Iterator[Any]:
        for _, value in self.named_memories():
            yield value

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        """copy.deepcopy as of any module, except that the tensors the layer holds with an autograd graph (its states,
        their sequences, after a training call) are copied detached, as pickling copies them: torch deep-copies graph
        leaves only, and a copy cannot share the original's graph."""
        for value in vars(self).values():
            for tensor in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(tensor, torch.Tensor) and not tensor.is_leaf and id(tensor) not in memo:
                    memo[id(tensor)] = tensor.detach().clone().requires_grad_(tensor.requires_grad)
        copied = cast(nn.Module, type(self).__new__(type(self)))
        memo[id(self)] = copied
        copied.__setstate__(copy.deepcopy(vars(self), memo))
        return copied


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


class Memories(MemoryViews):
    """SpikingJelly's memory protocol kept in the layer's own dict, for layers whose memories restart at fixed
    values: their names in order (`_memory_names`), the values `reset()` restores (`_reset_values`, copies),
    `detach()` in place, `Module.to` converting tensor memories. A base before `MemoryBase`, with nn.Module's own
    attribute handling (SpikingJelly's MemoryModule keeps memories in a dict of its own, which these layers do not
    use). `nn.Neuron` keeps its own: its reset values can name a parameter."""

    if not TYPE_CHECKING:  # mypy would read it as a class variable, not as the attribute hook it is
        __getattr__ = nn.Module.__getattr__
    __setattr__ = nn.Module.__setattr__
    __delattr__ = nn.Module.__delattr__
    __dir__ = nn.Module.__dir__
    _replicate_for_data_parallel = nn.Module._replicate_for_data_parallel
    _memory_names: tuple[str, ...]
    _reset_values: dict[str, Any]
    _step_mode: str

    @property
    def step_mode(self) -> str:
        return self._step_mode

    @step_mode.setter
    def step_mode(self, value: str) -> None:
        if value not in ("s", "m"):
            raise ValueError(f"step_mode: expected 's' (single step) or 'm' (multi step), got {value!r}")
        self._step_mode = value
        self._step_mode_set()

    def _step_mode_set(self) -> None:
        """What a layer forgets when its step mode is set (nothing here)."""

    def _start_memories(self, reset_values: dict[str, Any]) -> None:
        """Register the memories `reset_values` names (in order), each at its reset value."""
        self._memory_names = tuple(reset_values)
        self._reset_values = {}
        for name, value in reset_values.items():
            self.set_reset_value(name, value)
        self.reset()

    def reset(self) -> None:
        """Restore every memory to its reset value."""
        d = self.__dict__
        for name in d["_memory_names"]:
            d[name] = _copy(d["_reset_values"][name])

    def detach(self) -> None:
        """Cut the memories' autograd graphs in place, keeping their values (`functional.detach_net`)."""
        detach_memories(self.__dict__, self.__dict__["_memory_names"])

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Module.to() and friends convert tensor memories with the parameters (as SpikingJelly's memories)."""
        d = self.__dict__
        for name in d["_memory_names"]:
            if isinstance(d.get(name), torch.Tensor):
                d[name] = fn(d[name])
        return nn.Module._apply(cast(nn.Module, self), fn, *args, **kwargs)  # not MemoryModule's (a base)

    def register_memory(self, name: str, value: Any) -> None:
        """Add a memory that `reset()` restores to `value` (SpikingJelly's `MemoryModule.register_memory`)."""
        if not isinstance(name, str) or not name.isidentifier() or hasattr(self, name):
            raise ValueError(f"register_memory: {name!r} is not a free attribute name of {type(self).__name__}")
        self._memory_names = (*self._memory_names, name)
        self.set_reset_value(name, value)
        self.__dict__[name] = _copy(value)

    def set_reset_value(self, name: str, value: Any) -> None:
        self._memory_named(name, "set_reset_value")
        self._reset_values[name] = _copy(value)

    def get_reset_value(self, name: str) -> Any:
        self._memory_named(name, "get_reset_value")
        return self._reset_values[name]

    def named_memories(self) -> Iterator[tuple[str, Any]]:
        d = self.__dict__
        for name in d["_memory_names"]:
            yield name, d.get(name)

    def _memory_named(self, name: str, asked_by: str) -> None:
        if name not in self._memory_names:
            raise KeyError(f"{asked_by}: {name!r} is not a memory of this {type(self).__name__} "
                           f"(memories: {', '.join(self._memory_names)})")


def _copy(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)
