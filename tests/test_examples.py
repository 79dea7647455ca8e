"""The scripts in examples/ run (quick modes; the full training run and its accuracy are measured by hand and
stated in examples/train_digits.py and docs/examples.md)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(script: str, *args: str, timeout: float = 300) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / script), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)
    assert done.returncode == 0, f"{script} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_custom_neuron() -> None:
    out = run("custom_neuron.py", "--dtypes", "float32")
    assert "extern \"C\" __global__ void dtlif_fptt_float32" in out
    assert "host check: " in out and ", 0 failed" in out
    assert "one SGD step moves tau" in out


def test_train_digits_quick(tmp_path: Path) -> None:
    pytest.importorskip("sklearn", reason="the digits example needs scikit-learn (pip install -e '.[examples]')")
    pytest.importorskip("matplotlib", reason="the spike raster needs matplotlib (pip install -e '.[examples]')")
    out = run("train_digits.py", "--epochs", "1", "--quick", "--device", "cpu", "--out", str(tmp_path))
    assert "test accuracy" in out
    png = tmp_path / "spike_raster.png"
    assert png.is_file() and png.read_bytes().startswith(b"\x89PNG")
