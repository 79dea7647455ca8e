"""Constructor arguments' rules that the layers share: the backends a layer names, numbers checked by name, a
sequence's steps, a surrogate taken at any time (`TakesSurrogate`), and attributes fixed at construction (sizes
that parameters' shapes follow, settings that other values were derived from), read as attributes and refused by
name when set, so that a change never goes silently unseen."""
from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..spec.surrogate import Surrogate

__all__ = ["BACKENDS", "TakesSurrogate", "check_backend", "checked_attribute", "fixed_at_construction",
           "require_number", "as_values", "require_steps", "has_hooks", "refuse_proxy", "refuse_script"]

# a layer's `backend` -> the functional API's (SpikingJelly's 'torch' is our reference, its 'cupy' our kernels)
BACKENDS = {None: None, "auto": None, "torch": "reference", "reference": "reference", "cupy": "cuda",
            "cuda": "cuda", "host": "host"}


def check_backend(value: Any) -> None:
    """A layer's `backend`, at construction and when set: a name of BACKENDS, else a ValueError naming it."""
    if not isinstance(value, (str, type(None))) or value not in BACKENDS:
        raise ValueError(f"backend: expected one of {[b for b in BACKENDS if b]} or None, got {value!r}")


def require_number(name: str, value: Any, none: bool = False, finite: bool = False) -> None:
    """A real number (a Python or NumPy one; None too where `none`), else a TypeError naming the argument; with
    `finite`, a NaN or an infinity is a ValueError."""
    if value is None and none:
        return
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"{name}: expected a number{' or None' if none else ''}, got {value!r}")
    if finite and not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite number, got {value!r}")


def as_values(name: str, value: Any) -> torch.Tensor:
    """A number, a sequence of numbers or a tensor as a tensor (its own copy), else a TypeError naming the argument."""
    if isinstance(value, (str, bytes, bool)) or value is None:
        raise TypeError(f"{name}: expected a number, a sequence of numbers or a tensor, got {value!r}")
    try:
        tensor = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{name}: expected a number, a sequence of numbers or a tensor, got {value!r}") from None
    if tensor.dtype == torch.bool or tensor.is_complex():
        raise TypeError(f"{name}: expected real numbers, got a tensor of {tensor.dtype}")
    return tensor.clone().detach()


def require_steps(layer: nn.Module, x_seq: Any) -> None:
    """A multi-step call's input holds at least one step, else a ValueError naming the layer (its call would fail
    inside, on the first step it looks for)."""
    if isinstance(x_seq, torch.Tensor) and (x_seq.dim() == 0 or x_seq.shape[0] == 0):
        raise ValueError(f"{type(layer).__name__}: x_seq: expected a sequence of at least one step [T >= 1, *], got "
                         f"shape {tuple(x_seq.shape)}")


def fixed_at_construction(name: str, follows: str) -> property:
    """The attribute `name`, kept in the instance dict as `_<name>` (set there by the constructor); `follows` says
    what was made from it, for the error a later assignment raises."""
    def get(layer: nn.Module) -> Any:
        return layer.__dict__[f"_{name}"]

    def refuse(layer: nn.Module, value: Any) -> None:
        raise AttributeError(f"{type(layer).__name__}.{name} is fixed at construction ({get(layer)!r}): {follows}; "
                             f"build a new layer for {name}={value!r}")
    return property(get, refuse)


def checked_attribute(name: str, check: Callable[[Any], Any], doc: str) -> property:
    """The attribute `name`, read at every call, checked where set as at construction (`check` returns the value
    kept, or raises naming it), kept in the instance dict as `_<name>`. A layer pickled when it was a plain
    attribute is read as it was pickled."""
    key = f"_{name}"

    def get(layer: nn.Module) -> Any:
        found = layer.__dict__
        if key not in found and name in found:  # unpickled from before: the plain attribute's value
            found[key] = found.pop(name)
        return found[key]

    def put(layer: nn.Module, value: Any) -> None:
        layer.__dict__[key] = check(value)
    return property(get, put, doc=doc)


def has_hooks(module: nn.Module) -> bool:
    """Whether a call of `module` runs hooks (its own forward, pre-forward or backward hooks, or torch's global
    ones): a layer that does `module`'s work itself, not calling it, calls it where it has them, so that they run."""
    from torch.nn.modules import module as torch_module

    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks or torch_module._global_forward_hooks
                or torch_module._global_forward_pre_hooks or torch_module._global_backward_hooks
                or torch_module._global_backward_pre_hooks)


def refuse_proxy(layer: nn.Module | str, value: Any) -> None:
    """torch.fx.symbolic_trace calls a layer (or its class name, `layer`) on Proxies: refused by name (a layer keeps
    states between calls, which a symbolic trace would record as constants of its first call, and launches kernels,
    no torch ops)."""
    if isinstance(value, torch.fx.Proxy):
        name = layer if isinstance(layer, str) else type(layer).__name__
        raise TypeError(f"{name}: torch.fx.symbolic_trace cannot trace into autocuda's layers (they keep states "
                        f"between calls and launch kernels): trace with a torch.fx.Tracer whose is_leaf_module "
                        f"keeps them as leaves (isinstance of {name}), or use torch.compile or torch.export.export")


def refuse_script(layer: nn.Module) -> nn.Module:
    """torch.jit.script asks each module it compiles for `__prepare_scriptable__`: autocuda's layers (Python calls
    that keep states and launch kernels) are no TorchScript, so it is refused by name, not on a type annotation."""
    raise NotImplementedError(f"{type(layer).__name__}: torch.jit.script cannot compile autocuda's layers (their "
                              f"calls keep states between calls and launch kernels from Python); use torch.compile "
                              f"or torch.export.export")


def _prepare(surrogate: Any) -> None:
    """Build now what a call of our surrogate evaluates (its gradient, or its primitive where it is not spiking), so
    that torch.compile traces torch ops only, never the sympy that builds it."""
    if isinstance(surrogate, Surrogate):
        if surrogate.spiking:
            surrogate.gradient_of_x()
        else:
            surrogate(torch.zeros(()))


class TakesSurrogate(nn.Module):
    """A layer whose `surrogate_function` takes any surrogate at any time: ours (a plain attribute, prepared for
    torch.compile when set and after each change of its values, `_prepare`) or SpikingJelly's (a submodule), each
    replacing the other."""

    __prepare_scriptable__ = refuse_script

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "surrogate_function":
            modules = self.__dict__.get("_modules")
            if modules is not None and name in modules and not isinstance(value, nn.Module):
                del modules[name]  # a SpikingJelly surrogate (a module) replaced by another kind
            _prepare(value)
            if isinstance(value, Surrogate):
                value.watch(self)
        super().__setattr__(name, value)

    def _surrogate_changed(self, source: Surrogate) -> None:
        """Our surrogate `source` changed its values (it calls this): prepare it again where it is still ours."""
        if self.__dict__.get("surrogate_function") is source:
            _prepare(source)
