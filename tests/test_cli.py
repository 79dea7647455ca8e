"""The `autocuda` command: list, show, new + check, cache, version, one-line errors (bench: tests/test_benchmark.py)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autocuda import __version__
from autocuda.cli import main
from autocuda.spec.model import list_specs


def autocuda(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The installed entry point's code in a child process, output piped (as a user's shell pipeline)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run([sys.executable, "-m", "autocuda.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=600)


def test_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"autocuda {__version__}"


def test_list_names_every_shipped_spec_with_its_doc(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name, doc in list_specs():
        assert any(line.split()[0] == name and doc in line for line in out.splitlines()), name


def test_show_prints_plain_compilable_source_when_piped(nvcc):
    result = autocuda("show", "lif", "--kernel", "bptt", "--dtype", "float16")
    assert result.returncode == 0, result.stderr
    source = result.stdout
    assert "\x1b[" not in source, "escape codes in piped output"
    assert 'extern "C" __global__ void lif_bptt_float16' in source
    assert nvcc({"lif bptt float16": source}) == {}


def test_new_writes_a_skeleton_that_check_passes(tmp_path: Path):
    made = autocuda("new", "mymodel", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "mymodel.toml").is_file()
    shown = autocuda("show", "mymodel.toml", "--kernel", "fptt", cwd=tmp_path)
    assert shown.returncode == 0 and "mymodel_fptt_float32" in shown.stdout, shown.stderr
    checked = autocuda("check", "mymodel.toml", "--backend", "host", "--quick", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "pass" in checked.stdout and "FAIL" not in checked.stdout


def test_new_refuses_to_overwrite_and_refuses_bad_names(tmp_path: Path):
    assert autocuda("new", "mymodel", cwd=tmp_path).returncode == 0
    again = autocuda("new", "mymodel", cwd=tmp_path)
    assert again.returncode == 2 and "exists" in again.stderr
    assert autocuda("new", "mymodel", "--force", cwd=tmp_path).returncode == 0
    bad = autocuda("new", "__global__", cwd=tmp_path)
    assert bad.returncode == 2 and "__global__" in bad.stderr


@pytest.mark.parametrize("args, words", [
    (("show", "no_such_spec"), "no_such_spec"),
    (("check",), "--all"),
    (("show", "missing.toml"), "missing.toml"),
])
def test_errors_are_one_line_without_a_traceback(args, words):
    result = autocuda(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autocuda: error:") and words in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_debug_shows_the_traceback():
    result = autocuda("--debug", "show", "no_such_spec")
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_progress_bar_only_on_a_terminal(capsys, monkeypatch):
    from autocuda import cli

    cli._progress(1, 4, "lif")
    assert capsys.readouterr().err == "", "piped stderr gets no progress bar"
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    cli._progress(1, 4, "lif")
    err = capsys.readouterr().err
    assert "1/4 lif" in err and "[" + "#" * 7 + "." * 23 + "]" in err


def test_cache_shows_and_clears_what_is_stored(tmp_path, monkeypatch, capsys):
    from autocuda import store

    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(tmp_path))
    assert main(["cache"]) == 0
    assert "(empty)" in capsys.readouterr().out
    store.save("kernels", "a", b"{}")
    store.save("binaries", "b", b"\0" * 4096)
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path) in out
    assert any(line.split()[:2] == ["kernels", "1"] for line in out.splitlines())
    assert any(line.split()[:2] == ["binaries", "1"] for line in out.splitlines())
    assert main(["cache", "--clear"]) == 0
    assert "removed 2 entries" in capsys.readouterr().out
    assert store.usage() == [] and store.read("kernels", "a") is None
