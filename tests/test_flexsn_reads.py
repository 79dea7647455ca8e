"""The trace cache of FlexSN cores (autocuda.nn.flexsn, autocuda.spec.reads): a core is traced again when a value
it reads changed (a global, a module's or a class's attribute, a closure cell, a default, what a helper it calls
reads), kept while nothing changed, and traced each time where a value read cannot be compared safely."""
from __future__ import annotations

import types

import pytest
import torch

from autocuda.nn import FlexSN
from autocuda.nn.flexsn import flexsn_spec
from autocuda.spec.reads import reads_key
from autocuda.spec.surrogate import Sigmoid

sg = Sigmoid()
GAIN = 0.5
CONFIG = types.ModuleType("config")
CONFIG.GAIN = 0.5  # type: ignore[attr-defined]


class Settings:
    gain = 0.5


@pytest.fixture(autouse=True)
def cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(tmp_path / "cache"))


def global_core(x, v):
    h = v + x * GAIN
    s = sg(h - 1.0)
    return s, h * (1.0 - s)


def module_core(x, v):
    h = v + x * CONFIG.GAIN
    s = sg(h - 1.0)
    return s, h * (1.0 - s)


def class_core(x, v):
    h = v + x * Settings.gain
    s = sg(h - 1.0)
    return s, h * (1.0 - s)


def gain() -> float:
    return GAIN


def helper_core(x, v):
    h = v + x * gain()
    s = sg(h - 1.0)
    return s, h * (1.0 - s)


def default_core(x, v, *, g=0.5):
    h = v + x * g
    s = sg(h - 1.0)
    return s, h * (1.0 - s)


def output(core) -> float:
    """The membrane after one step from 0 with input 1 (below threshold): the gain the core was traced with."""
    layer = FlexSN(core, 1, step_mode="s", backend="reference")
    layer(torch.ones(1, dtype=torch.float64))
    return float(layer.states[0])


@pytest.mark.parametrize("core, change", [
    (global_core, lambda value: globals().__setitem__("GAIN", value)),
    (module_core, lambda value: setattr(CONFIG, "GAIN", value)),
    (class_core, lambda value: setattr(Settings, "gain", value)),
    (helper_core, lambda value: globals().__setitem__("GAIN", value)),
    (default_core, lambda value: setattr(default_core, "__kwdefaults__", {"g": value})),
], ids=["global", "module attribute", "class attribute", "helper's global", "default"])
def test_a_changed_value_is_traced_again(core, change):
    try:
        assert output(core) == 0.5
        change(0.25)
        assert output(core) == 0.25  # a new FlexSN(core) uses the new value
    finally:
        change(0.5)


def test_a_changed_closure_cell_is_traced_again():
    gain_value = 0.5

    def core(x, v):
        h = v + x * gain_value
        s = sg(h - 1.0)
        return s, h * (1.0 - s)

    assert output(core) == 0.5
    gain_value = 0.25
    assert output(core) == 0.25


def test_an_unchanged_core_is_not_traced_again():
    first = flexsn_spec(global_core, 1)
    assert flexsn_spec(global_core, 1) is first  # kept: the same StepSpec object


def test_a_core_reading_a_mutable_object_is_traced_each_time():
    gains = [0.5]

    def core(x, v):
        h = v + x * gains[0]
        s = sg(h - 1.0)
        return s, h * (1.0 - s)

    assert reads_key(core) is None  # a list may change in place: no key
    assert output(core) == 0.5
    gains[0] = 0.25
    assert output(core) == 0.25


def test_keys_are_stable_and_per_function():
    def make(value):
        def core(x, v):
            h = v + x * value
            s = sg(h - 1.0)
            return s, h * (1.0 - s)
        return core

    a, b = make(0.5), make(0.5)
    assert reads_key(a) != reads_key(b)  # two function objects: kept apart, as before
    key = reads_key(a)
    assert key == reads_key(a) and hash(key) == hash(reads_key(a))
