"""Record the spikes and states of a network's neuron layers over a run, through forward hooks.

    with Monitor(net) as mon:              # every `Neuron` layer in net: spikes and the membrane
        net(x_seq)
    mon.sequence("1", "v")                 # layer "1"'s membrane, [T, *]
    mon.firing_rates()                     # {layer name: mean firing rate, a 0-dim tensor}

What a layer gives, by its step mode:

| record | step_mode 's': a record per step | step_mode 'm': a record per call |
| --- | --- | --- |
| `"spike"` | the layer's output | the layer's output [T, *] |
| the membrane (first state) | `layer.v` after the step | `layer.v_seq` (`store_v_seq` is turned on) |
| another state `w` | `layer.w` after the step | `layer.w_seq`, where the layer keeps one (*) |

(*) autocuda's layers keep only the membrane's sequence: record other states in step mode 's', or run
`functional.multi_step(store_state_seq=True)`; a missing record is skipped with a warning (once per key).
While the monitor is attached, it turns `store_v_seq` on for each call in step mode 'm' and back off after it
(a copy of the network made between calls keeps the layers' own setting; `remove()` turns it off too, after a
call that raised).

Every record is stored as [T, *] (a step is [1, *], a view): `sequence` concatenates a layer's records along time.
Records stay on the layer's device, detached, without copies; the hooks never read values back to the host, so
recording adds no synchronisation. Records are the layer's tensors themselves: a later in-place change of an
output changes its record too.

Memory cap: `max_bytes` and/or `max_records`. The first layer call whose records would pass either limit is not
recorded; recording stops there (the records kept are the run's beginning, whole), a `MonitorFullWarning` is
issued once, and `full` becomes True. `clear()` empties the records and starts recording again.

An output that is no spike record (a list, as OTTT's [spike, trace]; in step mode 'm' a tensor that is no sequence
of the input's steps, as a non-spiking node's decoded membrane) is skipped with a warning that says so. A deep copy
of a watched network is not watched: the hooks it copies do nothing (they hold the monitor and the layer weakly);
nor is one saved and loaded (`torch.save`, `pickle`).

The same hooks serve any layer with SpikingJelly's conventions (`step_mode`, `v`, `store_v_seq`, `v_seq`): pass
`instance=spikingjelly.activation_based.neuron.BaseNode` to watch SpikingJelly's nodes.
"""
from __future__ import annotations

import warnings
import weakref
from collections.abc import Iterable, Iterator, Sequence
from types import TracebackType
from typing import Any

import torch
from torch import nn

from ..base.errors import AutocudaError
from ..nn.neuron import Neuron

__all__ = ["Monitor", "MonitorFullWarning"]

SPIKE = "spike"


class MonitorFullWarning(AutocudaError, UserWarning):
    """A monitor reached its memory cap and stopped recording."""


class Monitor:
    """Record spikes and states of the layers of `net` that are instances of `instance` (default: `Neuron`).

    `names`: only the layers of these names (`net.named_modules()` names). `states`: which states to record:
    "membrane" (the default: the first state, `v` of SpikingJelly's nodes), "all" (every state a layer gives in
    its step mode at construction: all in step mode 's', the membrane in 'm'), or a sequence of state names.
    `spikes=False` skips the outputs.
    """

    def __init__(self, net: nn.Module, instance: type | tuple[type, ...] | None = None, *,
                 names: Iterable[str] | None = None, states: Sequence[str] | str = "membrane", spikes: bool = True,
                 max_bytes: int | None = None, max_records: int | None = None):
        if not isinstance(net, nn.Module):
            raise TypeError(f"net: expected a torch.nn.Module, got {type(net).__name__}")
        if instance is not None and not (isinstance(instance, type) or (
                isinstance(instance, tuple) and instance and all(isinstance(t, type) for t in instance))):
            raise TypeError(f"instance: expected a class or a tuple of classes, got {instance!r}")
        if isinstance(states, str) and states not in ("membrane", "all"):
            raise ValueError(f"states: expected 'membrane', 'all' or a sequence of state names, got {states!r} "
                             f"(one state: states=({states!r},))")
        self.max_bytes, self.max_records = max_bytes, max_records
        self.enabled = True
        self.full = False
        self.nbytes = 0
        self.count = 0  # records stored
        self._warned: set[tuple[str, str]] = set()
        self._layers = _select(net, instance or Neuron, names)
        self._keys = {name: _keys(name, layer, states, spikes) for name, layer in self._layers}
        self.records: dict[str, dict[str, list[torch.Tensor]]] = {}
        self.clear()
        self._handles = []
        for name, layer in self._layers:
            if _membrane(layer) in self._keys[name] and hasattr(layer, "store_v_seq"):
                self._handles.append(layer.register_forward_pre_hook(_bound(self, layer, Monitor._keep_v_seq)))
            self._handles.append(layer.register_forward_hook(_bound(self, layer, self._hook(name))))

    # The caps are checked where set, also after construction (the next layer call reads them)
    @property
    def max_bytes(self) -> int | None:
        return self._max_bytes

    @max_bytes.setter
    def max_bytes(self, value: int | None) -> None:
        self._max_bytes = _limit("max_bytes", value)

    @property
    def max_records(self) -> int | None:
        return self._max_records

    @max_records.setter
    def max_records(self, value: int | None) -> None:
        self._max_records = _limit("max_records", value)

    # -- recording ------------------------------------------------------------------------------------
    def _keep_v_seq(self, layer: Any, inputs: Any) -> None:
        """Turn store_v_seq on for calls in step mode 'm' only (in step mode 's' a layer with it on copies a
        growing v_seq at every step). Every monitor of the layer that turned it on, or found it turned on by
        another, holds it on for this call: the last to let go turns it off (`_let_go`)."""
        holders = _HOLDERS.get(layer)
        if self.enabled and layer.step_mode == "m":
            if holders is None and layer.store_v_seq is False:
                layer.store_v_seq = True
                holders = _HOLDERS[layer] = weakref.WeakSet()
            if holders is not None:
                holders.add(self)
        elif layer.step_mode != "m":
            self._let_go(layer)

    def _let_go(self, layer: nn.Module) -> None:
        """Stop holding `layer`'s store_v_seq on; the last monitor to let go turns it off. (Each turning it off
        at once dropped the call's v_seq before a second monitor of the layer read it.)"""
        holders = _HOLDERS.get(layer)
        if holders is None or self not in holders:
            return
        holders.discard(self)
        if not holders:
            del _HOLDERS[layer]
            setattr(layer, "store_v_seq", False)  # noqa: B010 - a plain attribute of the layer, typed by it

    def _hook(self, name: str) -> Any:
        keys = self._keys[name]

        def hook(monitor: Monitor, layer: nn.Module, inputs: Any, output: Any) -> None:
            if monitor.enabled and not monitor.full:
                monitor._record(name, layer, keys, inputs, output)
            monitor._let_go(layer)  # for this call only: between calls the layer holds its own setting

        return hook

    def _record(self, name: str, layer: nn.Module, keys: Sequence[str], inputs: Any, output: Any) -> None:
        multi = getattr(layer, "step_mode", "s") == "m"
        found = []
        for key in keys:
            if key == SPIKE:
                why = _not_a_record(inputs, output, multi)
                if why:
                    self._missing(name, key, multi, why)
                    continue
                value = output
            else:
                value = getattr(layer, _attribute(layer, key, multi), None)
                if not isinstance(value, torch.Tensor):
                    self._missing(name, key, multi)
                    continue
            value = value.detach()
            found.append((key, value if multi else value.unsqueeze(0)))
        size = sum(v.numel() * v.element_size() for _, v in found)  # shapes only: no device read
        if (self.max_bytes is not None and self.nbytes + size > self.max_bytes) or \
                (self.max_records is not None and self.count + len(found) > self.max_records):
            self.full = True
            warnings.warn(f"Monitor: the memory cap ({self._cap()}) is reached at layer {name!r}; recording "
                          f"stopped (clear() starts it again)", MonitorFullWarning, stacklevel=4)
            return
        for key, value in found:
            self.records[name][key].append(value)
        self.nbytes += size
        self.count += len(found)

    def _missing(self, name: str, key: str, multi: bool, output: str = "") -> None:
        """Warn (once per layer and key) that `key` is not recorded: the output, `output` saying why it is none,
        or a state the layer does not keep."""
        if (name, key) in self._warned:
            return
        self._warned.add((name, key))
        if output:
            warnings.warn(f"Monitor: layer {name!r}'s output is {output}; {key!r} is not recorded", stacklevel=5)
            return
        where = f"{key}_seq (step_mode 'm')" if multi else f"{key} (step_mode 's')"
        advice = ("; record it in step_mode 's', or run functional.multi_step(store_state_seq=True)" if multi
                  else "")
        warnings.warn(f"Monitor: layer {name!r} has no tensor {where}; {key!r} is not recorded{advice}",
                      stacklevel=5)

    def _cap(self) -> str:
        caps = [f"max_bytes={self.max_bytes}"] * (self.max_bytes is not None)
        return ", ".join(caps + [f"max_records={self.max_records}"] * (self.max_records is not None))

    # -- reading --------------------------------------------------------------------------------------
    @property
    def layers(self) -> tuple[str, ...]:
        """The names of the watched layers, in the network's order."""
        return tuple(name for name, _ in self._layers)

    def keys(self, name: str) -> tuple[str, ...]:
        """What is recorded for layer `name`: "spike" and state names."""
        return tuple(self._keys[self._known(name)])

    def sequence(self, name: str, key: str = SPIKE) -> torch.Tensor:
        """Layer `name`'s records of `key` joined along time: [T, *] (on the layer's device)."""
        records = self._records_of(name, key)
        if not records:
            raise ValueError(f"key {key!r} of layer {name!r}: nothing recorded yet (run the network first)")
        shapes = {tuple(r.shape[1:]) for r in records}
        if len(shapes) > 1:
            raise ValueError(f"key {key!r} of layer {name!r}: records have different shapes {sorted(shapes)} "
                             f"(e.g. a smaller last batch); read monitor.records[{name!r}][{key!r}], a list")
        return torch.cat(records, 0)

    def __getitem__(self, name: str) -> dict[str, torch.Tensor]:
        """{key: sequence [T, *]} of layer `name`, for every key with records."""
        return {key: self.sequence(name, key) for key, records in self.records[self._known(name)].items() if records}

    def firing_rate(self, name: str, per_neuron: bool = False) -> torch.Tensor:
        """Layer `name`'s mean spike count per step: over every recorded value (0-dim), or per neuron [*]
        (averaged over time only). A tensor on the layer's device: reading it is the only synchronisation."""
        records = self._records_of(name, SPIKE)
        if not records:
            raise ValueError(f"layer {name!r}: no spikes recorded yet (run the network first, with spikes=True)")
        if per_neuron:
            return self.sequence(name, SPIKE).float().mean(0)
        total = torch.stack([r.float().sum() for r in records]).sum()
        return total / sum(r.numel() for r in records)

    def firing_rates(self) -> dict[str, torch.Tensor]:
        """{layer name: mean firing rate (0-dim tensor)} for every layer with recorded spikes."""
        return {name: self.firing_rate(name) for name in self.layers if self.records[name].get(SPIKE)}

    def summary(self) -> str:
        """A table: each layer's recorded steps, neurons, mean firing rate and bytes (reads the rates back)."""
        rows = [("layer", "steps", "neurons", "rate", "MiB")]
        for name in self.layers:
            spikes = self.records[name].get(SPIKE) or []
            size = sum(r.numel() * r.element_size() for rs in self.records[name].values() for r in rs)
            steps = sum(r.shape[0] for r in spikes)
            neurons = spikes[0].shape[1:].numel() if spikes else 0  # [0][0] failed on a record of 0 steps
            rate = f"{float(self.firing_rate(name)):.4f}" if spikes else "-"
            rows.append((name or "(net)", str(steps), str(neurons), rate, f"{size / 2**20:.2f}"))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)

    def _known(self, name: str) -> str:
        if name not in self.records:
            raise KeyError(f"layer {name!r} is not monitored (monitored: {', '.join(map(repr, self.layers))})")
        return name

    def _records_of(self, name: str, key: str) -> list[torch.Tensor]:
        by_key = self.records[self._known(name)]
        if key not in by_key:
            raise KeyError(f"key {key!r} is not recorded for layer {name!r} (recorded: {', '.join(by_key)})")
        return by_key[key]

    # -- control --------------------------------------------------------------------------------------
    def clear(self) -> None:
        """Forget every record; recording starts again if the cap had stopped it."""
        self.records = {name: {key: [] for key in self._keys[name]} for name, _ in self._layers}
        self.nbytes, self.count, self.full = 0, 0, False
        self._warned.clear()

    def enable(self) -> None:
        self.enabled = True

    def disable(self) -> None:
        self.enabled = False

    def remove(self) -> None:
        """Remove the hooks and give the layers their `store_v_seq` back; the records stay. Safe to repeat."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for _, layer in self._layers:
            self._let_go(layer)

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.remove()

    def __iter__(self) -> Iterator[str]:
        return iter(self.layers)

    def __repr__(self) -> str:
        return (f"Monitor(layers={list(self.layers)}, records={self.count}, nbytes={self.nbytes}, "
                f"full={self.full}, hooked={bool(self._handles)})")


# The layers whose store_v_seq monitors turned on for the call under way, each with the monitors that hold it on
_HOLDERS: weakref.WeakKeyDictionary[nn.Module, weakref.WeakSet[Monitor]] = weakref.WeakKeyDictionary()


def _limit(name: str, limit: Any) -> int | None:
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0):
        raise ValueError(f"{name}: expected an int > 0 or None, got {limit!r}")
    return limit


def _bound(monitor: Monitor, layer: nn.Module, hook: Any) -> Any:
    """`hook(monitor, layer, *args)` as a hook of `layer` that acts only on `layer` itself while the monitor lives.
    `copy.deepcopy` of a network copies its layers' hooks: a copy's layer then calls this same function (a function
    is not copied), and it does nothing there, rather than record the copy into this monitor (also after
    `remove()`, which reaches only the original layers' hooks). It holds the monitor and the layer by weak
    references, so that a copy's hooks keep neither the monitor's records nor the layer alive. A pickled network
    (`torch.save`) holds a hook that does nothing in its place: the loaded copy is not watched either."""
    return _Bound(weakref.ref(monitor), weakref.ref(layer), hook)


class _Bound:
    """A monitor's hook of one layer (`_bound`); pickled, a hook that does nothing (`_unwatched`)."""

    def __init__(self, monitor_ref: Any, layer_ref: Any, hook: Any):
        self.monitor_ref, self.layer_ref, self.hook = monitor_ref, layer_ref, hook

    def __call__(self, module: nn.Module, *args: Any) -> None:
        owner = self.monitor_ref()
        if owner is not None and module is self.layer_ref():
            self.hook(owner, module, *args)

    def __reduce__(self) -> tuple:
        return _unwatched, ()


def _unwatched() -> _Bound:
    """The hook of a layer loaded from a watched one: it holds no monitor and does nothing."""
    return _Bound(_no_monitor, _no_monitor, None)


def _no_monitor() -> None:
    return None


def _not_a_record(inputs: Any, output: Any, multi: bool) -> str:
    """Why a layer's output is not a record of "spike" ("" where it is one): it must be a tensor, and in step
    mode 'm' a sequence of the input's steps, [T, *] as the input (not a non-spiking node's decoded membrane
    [*], which `sequence` would join along its first dim as if it were time)."""
    if not isinstance(output, torch.Tensor):
        return f"a {type(output).__name__}, not a tensor"
    x = inputs[0] if isinstance(inputs, tuple) and inputs else None
    if multi and isinstance(x, torch.Tensor) and x.dim() >= 1 and (
            output.dim() != x.dim() or output.shape[:1] != x.shape[:1]):
        return (f"of shape {tuple(output.shape)}, not a sequence [T, *] of the input's {x.shape[0]} steps "
                f"(input {tuple(x.shape)})")
    return ""


def _select(net: nn.Module, instance: type | tuple[type, ...], names: Iterable[str] | None
            ) -> list[tuple[str, nn.Module]]:
    found = [(n, m) for n, m in net.named_modules() if _is_instance(m, instance)]
    if names is not None:
        wanted = [names] if isinstance(names, str) else list(names)
        by_name = dict(found)
        unknown = [n for n in wanted if n not in by_name]
        if unknown:
            raise ValueError(f"names: {unknown[0]!r} is not a layer of type {_type_names(instance)} in net "
                             f"(layers: {', '.join(map(repr, by_name)) or 'none'})")
        found = [(n, by_name[n]) for n in wanted]
    if not found:
        raise ValueError(f"instance: net has no layer of type {_type_names(instance)} to monitor")
    return found


def _is_instance(module: nn.Module, instance: type | tuple[type, ...]) -> bool:
    return isinstance(module, instance)


def _type_names(instance: type | tuple[type, ...]) -> str:
    types = instance if isinstance(instance, tuple) else (instance,)
    return " or ".join(t.__name__ for t in types)


def _membrane(layer: nn.Module) -> str:
    names = getattr(layer, "state_names", None)
    return names[0] if names else "v"


def _keys(name: str, layer: nn.Module, states: Sequence[str] | str, spikes: bool) -> list[str]:
    available = tuple(getattr(layer, "state_names", None) or ("v",))
    if states == "all":
        states = available if getattr(layer, "step_mode", "s") == "s" else available[:1]
    elif states == "membrane":
        states = available[:1]
    for state in states:
        if hasattr(layer, "state_names") and state not in available:
            raise ValueError(f"states: {state!r} is not a state of layer {name!r} (states: {', '.join(available)})")
    keys = [SPIKE] * bool(spikes) + list(dict.fromkeys(states))
    if not keys:
        raise ValueError("states, spikes: nothing to record (name a state, or leave spikes=True)")
    return keys


def _attribute(layer: nn.Module, key: str, multi: bool) -> str:
    """The attribute that holds state `key` after a call: the state itself in step mode 's', its sequence in
    'm' (the membrane's is `v_seq` whatever the membrane is called)."""
    if not multi:
        return key
    return "v_seq" if key == _membrane(layer) else f"{key}_seq"
