"""docs/spikingjelly.md's table of SpikingJelly 2.0's neuron classes: every class of SpikingJelly's neuron module
has a row, and a row that names an autocuda class names one that `autocuda.nn` exports under the same name."""
from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch

import autocuda.nn

DOC = Path(__file__).resolve().parents[1] / "docs" / "spikingjelly.md"
ROW = re.compile(r"^\| `(\w+)` \| (?:`autocuda\.nn\.(\w+)`|—) \|", re.MULTILINE)


def test_the_table_lists_every_spikingjelly_neuron_class() -> None:
    neuron = pytest.importorskip("spikingjelly.activation_based.neuron", reason="SpikingJelly 2.0 is a test extra")
    theirs = {name for name, value in vars(neuron).items()
              if inspect.isclass(value) and issubclass(value, torch.nn.Module)}
    rows = {name: ours for name, ours in ROW.findall(DOC.read_text())}
    assert set(rows) == theirs
    for name, ours in rows.items():
        if ours:
            assert ours == name and name in autocuda.nn.__all__, name
