"""The scripts in examples/ run (quick modes; the full training run and its accuracy are measured by hand and
stated in examples/train_digits.py and docs/examples.md).

They run as `__main__` in this process (`run`): a fresh interpreter would add only its imports. A script that
puts modules of its own into sys.modules has them taken out after it (`leave_modules_as_found`)."""
from __future__ import annotations

import runpy
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from autocuda.tools.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Callable[..., str]:
    """`run(script, *args)`: the script as `__main__` with these arguments, from the repository's root; its
    standard output. The global random state is restored after it."""
    def run_script(script: str, *args: str) -> str:
        path = ROOT / "examples" / script
        monkeypatch.setattr(sys, "argv", [str(path), *args])
        monkeypatch.chdir(ROOT)
        capsys.readouterr()
        with torch.random.fork_rng():
            try:
                runpy.run_path(str(path), run_name="__main__")
            except SystemExit as stop:
                assert stop.code in (None, 0), f"{script} exited with {stop.code}:\n{capsys.readouterr().err[-3000:]}"
        return capsys.readouterr().out
    return run_script


def leave_modules_as_found(names: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    """Put sys.modules' entries `names` back as they are now after the test: one absent now is set to None for the
    test (an import of it raises ImportError, as an absent module's does) and taken out after it, with whatever the
    script put there in its place."""
    for name in names:
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name))


def test_custom_neuron(run) -> None:
    out = run("custom_neuron.py", "--dtypes", "float32")
    assert "extern \"C\" __global__ void dtlif_fptt_float32" in out
    assert "host check: " in out and ", 0 failed" in out
    assert "one SGD step moves tau" in out


def test_train_digits_quick(tmp_path: Path, run) -> None:
    pytest.importorskip("sklearn", reason="the digits example needs scikit-learn (pip install -e '.[examples]')")
    pytest.importorskip("matplotlib", reason="the spike raster needs matplotlib (pip install -e '.[examples]')")
    out = run("train_digits.py", "--epochs", "1", "--quick", "--device", "cpu", "--out", str(tmp_path))
    assert "test accuracy" in out
    png = tmp_path / "spike_raster.png"
    assert png.is_file() and png.read_bytes().startswith(b"\x89PNG")


def test_train_digits_with_a_new_spec_file(tmp_path: Path, run) -> None:
    """A new user's path: `autocuda new` writes a spec, the digits example trains it (--spec)."""
    pytest.importorskip("sklearn", reason="the digits example needs scikit-learn (pip install -e '.[examples]')")
    pytest.importorskip("matplotlib", reason="the spike raster needs matplotlib (pip install -e '.[examples]')")
    spec = tmp_path / "my_neuron.toml"
    assert main(["new", str(spec)]) == 0
    out = run("train_digits.py", "--epochs", "1", "--quick", "--device", "cpu", "--out", str(tmp_path),
              "--spec", str(spec))
    assert "test accuracy" in out


def test_train_vgg_ddp_quick(run) -> None:
    """The DDP example as a process group of one (gloo): it trains, prints rank 0's test accuracy and leaves no
    process group behind."""
    pytest.importorskip("sklearn", reason="the digits example needs scikit-learn (pip install -e '.[examples]')")
    import torch.distributed as dist

    out = run("train_vgg_ddp.py", "--cpu", "--epochs", "1", "--quick", "--steps", "2")
    assert out.startswith("epoch 1: 1 process(es), train loss ")
    assert 0.0 <= float(out.split("test accuracy ")[1].split(",")[0]) <= 1.0
    assert not dist.is_initialized()


def test_flexsn_lif(run) -> None:
    pytest.importorskip("spikingjelly", reason="the example's core is SpikingJelly's (its surrogate module)")
    out = run("flexsn_lif.py", "--steps", "30")
    assert "traced spec: 0.5*v + 0.5*x | threshold 1.0 | reset hard" in out
    accuracy = float(out.split("test accuracy ")[1].split()[0])
    assert accuracy > 0.9


def test_train_sj_vgg_digits_quick(run, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("sklearn", reason="the digits example needs scikit-learn (pip install -e '.[examples]')")
    pytest.importorskip("spikingjelly", reason="the example trains SpikingJelly's model zoo")
    # where torchvision is missing, the script puts a stand-in for it into sys.modules: taken out after the test
    leave_modules_as_found(("torchvision", "torchvision.models", "torchvision.models.utils"), monkeypatch)
    # T = 2, not the script's 4: a ResNet-18's backward on the CPU is most of the run and grows with T, and two
    # steps already take every multi-step path of both neurons (the state carried from one step to the next)
    out = run("train_sj_vgg_digits.py", "--epochs", "1", "--quick", "--device", "cpu", "--steps", "2")
    theirs, ours = (line for line in out.splitlines() if "epoch 1" in line)
    assert theirs.startswith("SpikingJelly LIFNode") and ours.startswith("autocuda LIFNode")
    for line in (theirs, ours):  # (float32 rounding differs between the two: accuracies may differ a little)
        assert 0.0 <= float(line.split("test accuracy ")[1]) <= 1.0
