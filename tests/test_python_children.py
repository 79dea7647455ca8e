"""`python_children` runs a command as `python` does: the same argv, sys.path (PYTHONPATH's folders included),
working folder, environment, streams, exit status and atexit functions, held against a real interpreter."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import python_children

SHOW = ("import atexit, json, os, sys\n"
        "atexit.register(lambda: print('atexit ran'))\n"
        "print(json.dumps({'argv': sys.argv, 'path': sys.path, 'cwd': os.getcwd(), 'var': os.environ.get('PROBE'),\n"
        "                  'main': __name__}))\n"
        "print('to stderr', file=sys.stderr)\n")


def _both(args: list[str], env: dict[str, str], cwd: Path) -> tuple[subprocess.CompletedProcess, ...]:
    real = subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)
    return real, python_children.run(args, env=env, cwd=cwd, timeout=60)


@pytest.mark.parametrize("form", ["-c", "script", "-m"])
def test_a_child_sees_what_python_would_show_it(tmp_path: Path, form: str) -> None:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "shown.py").write_text(SHOW)
    (tmp_path / "script.py").write_text(SHOW)
    args = {"-c": ["-c", SHOW, "a", "b"], "script": [str(tmp_path / "script.py"), "a"], "-m": ["-m", "shown", "a"]}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PROBE": "seen",
                                                                        "PYTHONPATH": str(tmp_path / "lib")}
    real, forked = _both(args[form], env, tmp_path)
    assert (forked.returncode, forked.stdout, forked.stderr) == (real.returncode, real.stdout, real.stderr)
    assert real.stdout.endswith("atexit ran\n")


@pytest.mark.parametrize(("code", "status"), [
    ("import sys; sys.exit(3)", 3),
    ("import sys; sys.exit('a message')", 1),
    ("raise ValueError('shown')", 1),
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -9),
])
def test_a_child_ends_with_pythons_status_and_message(tmp_path: Path, code: str, status: int) -> None:
    real, forked = _both(["-c", code], dict(os.environ), tmp_path)
    assert real.returncode == forked.returncode == status
    assert real.stderr.splitlines()[-1:] == forked.stderr.splitlines()[-1:]


def test_a_child_past_its_timeout_is_killed(tmp_path: Path) -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        python_children.run(["-c", "import time; time.sleep(60)"], cwd=tmp_path, timeout=0.5)


def test_a_child_has_torch_and_nothing_of_ours() -> None:
    probe = "import sys; print(sorted(m for m in ('torch', 'sympy', 'autocuda') if m in sys.modules))"
    assert python_children.run(["-c", probe], check=True).stdout.strip() == "['torch']"
